"""A model's registration in a local run: the gate's decision only; each target registers
the models that clear the gate in its own registry (`VertexSettings.registration`,
`KubeflowSettings.registration`)."""


def local_registration(would_register: bool) -> dict:
    """The `registration` section of a local run's summary: the gate's decision only."""
    return {"would_register": bool(would_register), "uploaded": False,
            "note": "the local run never uploads to the Vertex Model Registry"}

"""How a Vertex job gets its machines: on demand, Spot, flex-start (Dynamic Workload
Scheduler), or from a reservation; refused here where Vertex would refuse them."""

from __future__ import annotations

import re
from typing import Any

from pipelines.definitions.machine import Machine

# The step option's values and Vertex's Scheduling.Strategy for each.
STRATEGIES = {"standard": "STANDARD", "spot": "SPOT", "flex-start": "FLEX_START"}
# GPUs whose machines (G2, A2, A3, A4) flex-start provisions.
FLEX_START_GPUS = ("NVIDIA_L4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_H100_80GB",
                   "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB", "NVIDIA_B200")
FLEX_START_MAX_TIMEOUT_S = 7 * 86400
# A Compute Engine reservation, as Vertex's ReservationAffinity names one.
RESERVATION_NAME = re.compile(r"^projects/[a-z0-9][a-z0-9:.-]*/zones/[a-z]+-[a-z]+\d+-[a-z]/"
                              r"reservations/[a-z]([-a-z0-9]*[a-z0-9])?$")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# GCPC's custom-job arguments -> the names of a MachineSpec's `reservation_affinity`.
_AFFINITY = {"reservation_affinity_type": "reservation_affinity_type",
             "reservation_affinity_key": "key", "reservation_affinity_values": "values"}


def strategy(machine: Machine, spot: bool) -> str:
    """Vertex's scheduling strategy for a step: its own, else Spot under `--spot`."""
    return STRATEGIES.get(machine.scheduling_strategy, "SPOT" if spot else "STANDARD")


def seconds(duration: str) -> int:
    """A duration such as "90m", "2h", "1d" or "3600s" (bare: seconds) in seconds.

    Raises:
        ValueError: Not a whole number with one of those units.
    """
    m = _DURATION.match(duration.strip())
    if not m:
        raise ValueError(f"{duration!r} is not a duration such as 90m, 2h, 1d or 3600s")
    return int(m.group(1)) * _SECONDS[m.group(2)]


def scheduling_problems(step: str, machine: Machine, spot: bool, timeout_s: int) -> list[str]:
    """What Vertex would refuse in a step's scheduling, each naming the option.

    Args:
        step: A key of DEFAULT_MACHINES (names the `--<step>-...` options).
        machine: The step's machines and scheduling.
        spot: `--spot`.
        timeout_s: `--step-timeout`.
    """
    flag = "--" + step.replace("_", "-")
    if machine.scheduling_strategy and machine.scheduling_strategy not in STRATEGIES:
        return [f"{flag}-scheduling-strategy must be one of {sorted(STRATEGIES)}, got "
                f"{machine.scheduling_strategy!r}"]
    problems, chosen = [], strategy(machine, spot)
    flex = chosen == "FLEX_START"
    if flex and machine.accelerator_type not in FLEX_START_GPUS:
        problems.append(
            f"{flag}-scheduling-strategy flex-start: Vertex's flex-start provisions L4, A100, "
            f"H100, H200 and B200 machines only; this step has "
            f"{machine.accelerator_type or 'no GPU'} (use standard or spot, or such a GPU)")
    if flex and timeout_s > FLEX_START_MAX_TIMEOUT_S:
        problems.append(f"{flag}-scheduling-strategy flex-start: a flex-start job runs at most "
                        f"7 days; --step-timeout is {timeout_s}s")
    if machine.max_wait:
        try:
            seconds(machine.max_wait)
        except ValueError as err:
            problems.append(f"{flag}-max-wait: {err}")
        if not flex:
            problems.append(f"{flag}-max-wait is how long a flex-start job waits for its "
                            f"machines: add {flag}-scheduling-strategy flex-start")
    name = machine.reservation
    if name and name != "any" and not RESERVATION_NAME.match(name):
        problems.append(f"{flag}-reservation takes 'any' or projects/PROJECT/zones/ZONE/"
                        f"reservations/NAME, got {name!r}")
    elif name and chosen in ("SPOT", "FLEX_START"):
        problems.append(f"{flag}-reservation: a {chosen.lower().replace('_', '-')} job does not "
                        "use reservations; drop one of them (a reservation runs on demand)")
    return problems


def job_scheduling(machine: Machine, spot: bool) -> dict[str, Any]:
    """GCPC's custom-job arguments for the step's scheduling and reservation."""
    arguments: dict[str, Any] = {"strategy": strategy(machine, spot)}
    if machine.max_wait:
        arguments["max_wait_duration"] = f"{seconds(machine.max_wait)}s"
    if machine.reservation == "any":
        arguments["reservation_affinity_type"] = "ANY_RESERVATION"
    elif machine.reservation:
        arguments.update(reservation_affinity_type="SPECIFIC_RESERVATION",
                         reservation_affinity_key=RESERVATION_KEY,
                         reservation_affinity_values=[machine.reservation])
    return arguments


def trial_scheduling(machine: Machine, spot: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tuning trials' CustomJobSpec `scheduling` and MachineSpec `reservation_affinity`
    (empty where nothing differs from Vertex's defaults)."""
    arguments = job_scheduling(machine, spot)
    scheduling = {key: value for key, value in arguments.items() if key == "max_wait_duration"
                  or (key == "strategy" and value != "STANDARD")}
    return scheduling, {_AFFINITY[key]: value for key, value in arguments.items()
                        if key in _AFFINITY}

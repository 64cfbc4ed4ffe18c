"""Readers and writers of the files steps hand each other, one module per format (a step's
`contract.py` names them). They import contracts, `components.common` and each other only,
never a step's logic, and import their frameworks inside the functions that need them."""

"""The kopf handlers: thin functions that hand every trigger to the operator's one Runtime (`memo.runtime`,
made by main.py). Importing this package registers them."""

from . import lifecycle, runs, sweeps  # noqa: F401

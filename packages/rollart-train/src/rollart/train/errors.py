"""The one exception class of rollart.train."""

from __future__ import annotations


class TrainError(ValueError):
    """Bad input to a trainer, a loss or a batch builder.

    A `ValueError` subclass so callers that catch `ValueError` keep working; the message always
    names the field, the offending value and what was allowed.
    """

"""mapping.Error and one subclass per mapping_status, built from the C library's list."""
from . import _core


class Error(Exception):
    """A call into libmapping failed. ``status`` is the C status code (negative),
    ``status_name`` its name (e.g. ``"ERR_OUT_OF_RANGE"``); ``str(e)`` is the
    library's message (mapping_last_error_message)."""

    status = None
    status_name = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status

    def __str__(self):
        return str(self.args[0]) if self.args else ""


# Python-side base classes that make the natural `except` clauses work too.
_EXTRA_BASES = {
    "ERR_NULL_ARGUMENT": (TypeError,),
    "ERR_INVALID_ARGUMENT": (ValueError,),
    "ERR_ZERO_SIZE": (ValueError,),
    "ERR_OUT_OF_RANGE": (IndexError, ValueError),
    "ERR_OUT_OF_HOST_MEMORY": (MemoryError,),
    "ERR_OUT_OF_DEVICE_MEMORY": (MemoryError,),
    "ERR_UNSUPPORTED": (NotImplementedError,),
}


def _class_name(status_name):
    # ERR_OUT_OF_RANGE -> OutOfRangeError
    words = status_name[4:].lower().split("_")
    return "".join(w.capitalize() for w in words) + "Error"


ERRORS = {}  # status int -> class
BY_NAME = {}  # status name -> class
for _name, _value, _message in _core.statuses():
    if _value == 0:
        continue
    _cls = type(_class_name(_name), (Error,) + _EXTRA_BASES.get(_name, ()),
                {"status": _value, "status_name": _name, "__doc__": _message,
                 "__str__": Error.__str__, "__module__": "mapping"})
    ERRORS[_value] = _cls
    BY_NAME[_name] = _cls

_core.set_errors(Error, ERRORS)

__all__ = ["Error"] + [c.__name__ for c in ERRORS.values()]
globals().update({c.__name__: c for c in ERRORS.values()})

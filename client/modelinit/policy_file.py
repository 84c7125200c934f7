"""The policy text format (JSON/YAML <-> the ``Policy`` message), where callers import it:
``modelinit.policy_file.to_dict(policy)``. It lives in ``modelinit_wire.policy_file`` (the
server reads the same format); this module re-exports its public functions."""
from modelinit_wire.policy_file import MAX_FILE_BYTES, MAX_YAML_VALUES, from_arg, from_dict, load, looks_like_file, to_dict

__all__ = ["MAX_FILE_BYTES", "MAX_YAML_VALUES", "from_arg", "from_dict", "load", "looks_like_file", "to_dict"]

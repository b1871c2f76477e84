"""What Accelerate's own settings say (its config file, ``ACCELERATE_DEBUG_MODE``), read as Accelerate reads them."""

from __future__ import annotations

import os

from .errors import LaunchArgumentError
from .schema.events import TRUE_VALUES


def accelerate_default_config_file() -> str:
    """Where ``accelerate config`` writes its default file."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return os.path.join(hf_home, "accelerate", "default_config.yaml")


def resolve_debug(debug, config_file) -> bool | None:
    """debug=True/False decides; else ACCELERATE_DEBUG_MODE in the kernel; else ``debug:`` in the config file
    (``config_file``, else ACCELERATE_CONFIG_FILE, else Accelerate's default file when it exists); else None."""
    if debug is not None:
        if not isinstance(debug, bool):
            raise TypeError(f"debug must be True, False or None, got {type(debug).__name__}: {debug!r}")
        return debug
    if config_file is not None and not os.path.isfile(config_file):
        raise LaunchArgumentError(f"config_file={config_file!r} does not exist; give the path of an Accelerate "
                                  "config YAML (as written by `accelerate config`) or leave it out")
    environment = os.environ.get("ACCELERATE_DEBUG_MODE", "").strip().lower()
    if environment:
        return environment in TRUE_VALUES
    path = config_file or os.environ.get("ACCELERATE_CONFIG_FILE") or accelerate_default_config_file()
    if not os.path.isfile(path):
        return None
    import yaml

    try:
        with open(path, encoding="utf-8") as config:
            settings = yaml.safe_load(config) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise LaunchArgumentError(f"the Accelerate config file {path} cannot be read: {exc}") from exc
    value = settings.get("debug") if isinstance(settings, dict) else None
    return None if value is None else str(value).strip().lower() in TRUE_VALUES

"""What Accelerate's own settings say (its config file, ``ACCELERATE_DEBUG_MODE``), read as Accelerate reads them."""

from __future__ import annotations

import functools
import os

from .errors import LaunchArgumentError
from .schema.events import TRUE_VALUES

# An Accelerate config file is a few hundred bytes of plain keys: these bounds only stop a file that is not one
# (a YAML alias bomb, whose expansion grows exponentially with its aliases; a log written to the wrong path).
MAX_CONFIG_BYTES = 256 * 1024
MAX_ALIASES = 20


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
        what = "is not a regular file" if os.path.exists(config_file) else "does not exist"
        raise LaunchArgumentError(f"config_file={config_file!r} {what}; give the path of an Accelerate "
                                  "config YAML (as written by `accelerate config`) or leave it out")
    environment = os.environ.get("ACCELERATE_DEBUG_MODE", "").strip().lower()
    if environment:
        return environment in TRUE_VALUES
    path = config_file or os.environ.get("ACCELERATE_CONFIG_FILE") or accelerate_default_config_file()
    if not os.path.isfile(path):
        return None
    value = read_config(path).get("debug")
    if value is None:
        return None
    if not isinstance(value, (bool, int, float, str)):
        raise LaunchArgumentError(f"the Accelerate config file {path} says debug: {type(value).__name__}, not true "
                                  "or false: write `debug: true` or `debug: false` there")
    return str(value).strip().lower() in TRUE_VALUES


def read_config(path: str) -> dict:
    """An Accelerate config file's settings ({} for an empty one), read with bounds: at most ``MAX_CONFIG_BYTES``
    bytes and ``MAX_ALIASES`` YAML aliases (``*name``), UTF-8 text, a mapping at the top. Anything else is a
    ``LaunchArgumentError`` naming the file, at once."""
    import yaml

    def refused(why: str) -> LaunchArgumentError:
        return LaunchArgumentError(f"the Accelerate config file {path} {why}; fix it, rewrite it with "
                                   "`accelerate config`, or pass config_file= another file")

    try:
        with open(path, "rb") as config:
            raw = config.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise refused(f"cannot be read ({exc.strerror or exc})") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise refused(f"is over {MAX_CONFIG_BYTES // 1024} KB, which no config file written by `accelerate "
                      "config` is")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refused(f"is not UTF-8 text ({raw[exc.start:exc.start + 1]!r} at offset {exc.start}): save it as "
                      "UTF-8") from None
    try:
        settings = yaml.load(text, Loader=_bounded_loader()) or {}  # a SafeLoader
    except _TooManyAliases:
        raise refused(f"uses more than {MAX_ALIASES} YAML aliases (*name): a config file needs none, and "
                      "aliases of aliases can expand to more than memory holds") from None
    except yaml.YAMLError as exc:
        raise refused(f"is not valid YAML: {exc}") from None
    if not isinstance(settings, dict):
        raise refused(f"holds a {type(settings).__name__}, not the mapping of settings (`debug: true`, ...)")
    return settings


class _TooManyAliases(Exception):
    pass


@functools.cache
def _bounded_loader():
    import yaml  # only when a config file is read

    class BoundedLoader(yaml.SafeLoader):
        """PyYAML's SafeLoader, counting the aliases it resolves."""

        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise _TooManyAliases
            return super().compose_node(parent, index)

    return BoundedLoader


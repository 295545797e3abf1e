"""In-tree tox plugin: let a tox environment use the packages of the interpreter that runs tox.

Why. GPU machines usually come with a CUDA build of torch preinstalled, often inside a virtual
environment (ours: /opt/torch/.venv, offline). Installing torch again into every tox environment costs
gigabytes and needs a network; ``sitepackages = true`` does not help, because virtualenv builds the tox
environment from the *base* interpreter behind that venv, so the environment sees the base
interpreter's site-packages and not the venv's: ``import torch`` fails.

What. For an environment with ``host_site_packages = true`` this plugin writes
``_host_site_packages.pth`` into the environment's site-packages, listing the site-packages folders of
the interpreter running tox. Python appends the folders named in a ``.pth`` file to ``sys.path`` *after*
the environment's own site-packages, so:

* anything installed in the environment wins over the host's copy;
* the environment's pip counts the host's distributions as installed (pip reads what is installed from
  ``sys.path``), so installing ``deps`` skips every requirement the host already satisfies and touches
  the network only for what is missing. Offline with everything present, nothing is fetched; where
  packages can be fetched and the host has no torch, pip installs one into the environment (on Linux
  x86_64, PyPI's default torch wheel is a CUDA build).

The folders are shared only when the environment's interpreter has the same version and implementation
as the one running tox (compiled extensions such as torch's are built for one Python ABI); otherwise the
plugin says so and the environment installs everything itself.

Turn it off for one run with ``tox -e gpu -x testenv:gpu.host_site_packages=false``.
"""

from __future__ import annotations

import logging
import site
import sys
from pathlib import Path

from tox.plugin import impl

PTH_NAME = "_host_site_packages.pth"
_announced: set[str] = set()  # environments whose shared folders were logged in this run


@impl
def tox_add_env_config(env_conf, state) -> None:  # noqa: ARG001 (hook signature)
    env_conf.add_config(
        keys=["host_site_packages"],
        of_type=bool,
        default=False,
        desc="append the site-packages of the interpreter running tox to this environment's sys.path",
    )


@impl
def tox_on_install(tox_env, arguments, section, of_type) -> None:  # noqa: ARG001 (hook signature)
    # Runs before each install step (deps, package deps): the .pth must exist before pip decides what is missing.
    _link_host_site_packages(tox_env)


@impl
def tox_before_run_commands(tox_env) -> None:
    # Also on a reused environment, where no install step runs (the host may have changed since).
    _link_host_site_packages(tox_env)


def host_site_dirs() -> list[str]:
    """The site-packages folders of the interpreter running tox: existing ones, each once, in the order
    ``site`` lists them.

    Only real site folders are shared, not ``PYTHONPATH`` entries (where, offline, tox itself may live).
    """
    dirs: dict[Path, str] = {}
    for d in site.getsitepackages():
        if Path(d).is_dir():
            dirs.setdefault(Path(d).resolve(), d)  # lib64 is often a link to lib
    return list(dirs.values())


def _link_host_site_packages(tox_env) -> None:
    if "host_site_packages" not in tox_env.conf or not tox_env.conf["host_site_packages"]:
        return
    env_site = Path(tox_env.env_site_package_dir())
    pth = env_site / PTH_NAME
    env_info = tox_env.base_python  # the interpreter the environment was created from
    host = (sys.implementation.name, sys.version_info[:2])
    env = (env_info.implementation.lower(), tuple(env_info.version_info[:2]))
    if env != host:
        pth.unlink(missing_ok=True)
        env_py, host_py = (f"{name} {major}.{minor}" for name, (major, minor) in (env, host))
        _announce(
            tox_env.name,
            f"host_site_packages skipped: the environment runs {env_py}, tox runs {host_py}; every dependency "
            "is installed into the environment instead",
        )
        return
    dirs = [d for d in host_site_dirs() if Path(d).resolve() != env_site.resolve()]
    text = "".join(f"{d}\n" for d in dirs)
    if not pth.exists() or pth.read_text() != text:
        env_site.mkdir(parents=True, exist_ok=True)
        pth.write_text(text)
    _announce(tox_env.name, f"sees the packages in {', '.join(dirs) or 'nothing'} (after its own)")


def _announce(env_name: str, message: str) -> None:
    """Log ``message`` once per environment and run (the hooks above fire several times)."""
    if env_name not in _announced:
        _announced.add(env_name)
        logging.warning(message)  # tox prefixes the environment name

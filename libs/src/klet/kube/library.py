"""The pieces of the `kubernetes` package klet uses, loaded without what it never uses
(issue 42, cluster-mode memory): the only module that imports `kubernetes`.

klet's apiserver client (klet.kube.client) uses four things of the library: the
kubeconfig loader (`kubernetes.config.load_kube_config`: certificates, tokens, exec
plugins, CA, embedded data), its `Configuration`, the REST layer below the ApiClient
(`kubernetes.client.rest.RESTClientObject`: urllib3's TLS pool built from that
configuration) and `kubernetes.watch.Watch`. Imported the ordinary way they cost about
19 MB resident in each of the three services that talk to the apiserver (a fresh
Python 3.11 under -OO, on top of asyncio and urllib3), because of imports made for the
library's other users:

- the package's `__init__` imports every subpackage: dynamic, stream (websocket),
  leaderelection, informer, utils (which imports the YAML object creator); and
  `kubernetes.utils`' `__init__` does the same for its helpers, of which the REST layer
  needs two small modules (retry, keepalive);
- `kubernetes.config.kube_config` imports `requests_oauthlib` (and with it `requests`),
  `oauthlib.oauth2` and the `ApiClient` (pydantic, dateutil, the model registry,
  multiprocessing's pool) at the top, for the `oidc` auth-provider's token refresh and
  for `new_client_from_config`, neither of which runs unless a kubeconfig asks for it;
- `Watch.__init__` builds an ApiClient, to turn events into model objects and read an
  error answer; RawWatch (klet.kube.client) does neither (its events stay the JSON dicts
  they came as; the request raises on an error answer before Watch reads one).

Loaded as below they cost about 3.6 MB, and the library stays whole:

1. `kubernetes` and `kubernetes.utils` are entered in `sys.modules` as the packages they
   are (their spec, `__path__`, loader) with their `__init__` not yet run, so that their
   submodules import as usual. The first attribute either is asked for that is not a
   submodule already imported (`kubernetes.__version__`, `kubernetes.utils.
   create_from_yaml`) runs the real `__init__` in that same module object, so any other
   user in the process sees the whole package. A process that imported the package
   before (the unit tests' tools) keeps it as it is.
2. While `kubernetes.config.kube_config` is imported, the three names it binds for the
   auth-provider refresh (`OAuth2Session`, `oauthlib`, `ApiClient`) are bound to stand-ins
   that import the real object at their first use: a kubeconfig with an `oidc`
   auth-provider still refreshes its token through requests_oauthlib, it only loads it
   then. The stand-ins are in `sys.modules` (and `kubernetes.client`'s namespace) for the
   one import only, and taken out after it, whatever happened; a module already loaded
   is used as it is.
3. `watch()` (RawWatch) is built without Watch's ApiClient.

`tests/unit/test_kube_library.py` pins both: a fresh interpreter importing
klet.kube.client holds none of requests_oauthlib, requests, oauthlib, pydantic,
dateutil, websocket, `kubernetes.dynamic`, `kubernetes.client.api_client`; the stand-ins
reach the real OAuth2Session, oauthlib error class and ApiClient; the package's own
attributes are there when asked for. A library upgrade that changes these imports
fails that test rather than going unnoticed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "ApiException",
    "Configuration",
    "RESTClientObject",
    "Watch",
    "load_kube_config",
]

_init_lock = threading.RLock()


def _deferred_package(name: str) -> None:
    """Enter package `name` in sys.modules without running its `__init__` (point 1 of
    the module docstring); its `__init__` runs at the first attribute missed."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name}: not an installed package")
    loader = spec.loader
    module = importlib.util.module_from_spec(spec)
    running = False

    def __getattr__(attr: str) -> Any:
        nonlocal running
        if attr.startswith("__") and attr not in ("__version__", "__project__", "__all__"):
            raise AttributeError(attr)
        with _init_lock:
            if running:
                # The __init__'s own `from . import x` asks before importing x.
                raise AttributeError(attr)
            if "__getattr__" in module.__dict__:
                running = True
                try:
                    loader.exec_module(module)
                finally:
                    running = False
                    if module.__dict__.get("__getattr__") is __getattr__:
                        del module.__dict__["__getattr__"]
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    module.__dict__["__getattr__"] = __getattr__
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


class _Deferred:
    """Stands for `module.attr` in a namespace: the real object is imported at the
    first call (a class or function) or attribute read (a module)."""

    def __init__(self, module: str, attr: str | None = None) -> None:
        self._module = module
        self._attr = attr

    def _target(self) -> Any:
        if isinstance(sys.modules.get(self._module), _DeferredModule):
            raise ImportError(f"{self._module} is used while it is being deferred")
        module = importlib.import_module(self._module)
        return module if self._attr is None else getattr(module, self._attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._attr is None:
            # A submodule (`oauthlib.oauth2`) or a name of the real module.
            try:
                return importlib.import_module(f"{self._module}.{attr}")
            except ModuleNotFoundError:
                pass
        return getattr(self._target(), attr)


class _DeferredModule(types.ModuleType):
    """A stand-in module in sys.modules while kube_config is imported: `from m import
    name` gets a `_Deferred` for the names given, `import m.sub` binds `m` itself."""

    def __init__(self, name: str, names: tuple[str, ...]) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package, so `import m.sub` finds m.sub in sys.modules
        for attr in names:
            setattr(self, attr, _Deferred(name, attr))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(_Deferred(self.__name__), attr)


@contextmanager
def _stand_ins(modules: dict[str, tuple[str, ...]], client: types.ModuleType) -> Iterator[None]:
    """Point 2 of the module docstring: the stand-ins for the duration of one import."""
    entered: list[str] = []
    for name, names in modules.items():
        if name not in sys.modules:
            sys.modules[name] = _DeferredModule(name, names)
            entered.append(name)
    # kube_config's `from kubernetes.client import ApiClient`: kubernetes.client resolves
    # names lazily (and keeps what it resolved), so the stand-in goes in its namespace.
    api_client = "ApiClient" not in client.__dict__
    if api_client:
        client.__dict__["ApiClient"] = _Deferred("kubernetes.client.api_client", "ApiClient")
    try:
        yield
    finally:
        for name in entered:
            if isinstance(sys.modules.get(name), _DeferredModule):
                del sys.modules[name]
        if api_client and isinstance(client.__dict__.get("ApiClient"), _Deferred):
            del client.__dict__["ApiClient"]


def _prepare() -> None:
    """Points 1 and 2 of the module docstring, before the imports below."""
    _deferred_package("kubernetes")
    _deferred_package("kubernetes.utils")
    if "kubernetes.config.kube_config" in sys.modules:
        return
    k8s_client = importlib.import_module("kubernetes.client")
    with _stand_ins(
        {"requests_oauthlib": ("OAuth2Session",), "oauthlib": (), "oauthlib.oauth2": ()},
        k8s_client,
    ):
        importlib.import_module("kubernetes.config.kube_config")


_prepare()

from kubernetes.client.configuration import Configuration  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.client.rest import RESTClientObject  # noqa: E402
from kubernetes.config.kube_config import load_kube_config  # noqa: E402
from kubernetes.watch.watch import Watch  # noqa: E402

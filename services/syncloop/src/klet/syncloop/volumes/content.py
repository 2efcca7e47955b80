"""The content volumes: configMap, secret, downwardAPI and projected.

Each set-up reads what the volume shows (the ConfigMap or Secret through the
kubeobjects reader and its short cache, the pod itself, tokens from the TokenRequest
API), builds the payload (`payloads`) and hands it to the atomic writer, which changes
nothing on disk when the content is the same. set_up runs at every sync of the pod
(syncloop resyncs every pod each syncFrequency), so a changed object reaches the
running containers within about a sync period without a restart, as with upstream.

As upstream, the object is read before anything is made on disk: a volume whose
object is missing leaves no directory behind. Where the files live follows upstream's
wrapped emptyDir: a configMap volume is a plain directory on the node's disk; secret,
downwardAPI and projected volumes (which may hold credentials: tokens, keys) are each a
tmpfs of their own, so their content is never written to disk. The volume directory
is mode 0755, not the 0777 of the emptyDir upstream wraps: only klet writes there (the
containers get it read-only), and any container user must be able to read it. Files
carry the modes of the spec, and with the pod's fsGroup everything is given to that
group (`atomic.set_group_ownership`). Other users of the host are kept out by the pod
directory above (0750, root's: `poddirs`).

Without an apiserver (standalone) configMap, secret and projected volumes cannot be
set up, as upstream's kubelet without a kube client; downwardAPI volumes work.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from klet.model.types import JSON
from klet.syncloop.environment.kubeobjects import ObjectUnavailable
from klet.syncloop.volumes import atomic, emptydir, fs, payloads
from klet.syncloop.volumes.atomic import FileProjection
from klet.syncloop.volumes.base import VolumeContext, VolumeError
from klet.syncloop.volumes.tokens import TokenError

VOLUME_DIR_MODE = 0o755

ForgetTokens = Callable[[str], None]
"""Drops the cached tokens of a pod, by UID (`TokenManager.forget_pod`)."""


def _namespace(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def _no_client(kind: str, volume: JSON) -> VolumeError:
    return VolumeError(
        f"cannot setup {kind} volume {volume.get('name', '')} because kube client is not configured"
    )


async def _read(ctx: VolumeContext, kind: str, name: str, *, optional: bool) -> JSON | None:
    """The ConfigMap or Secret `name` of the pod's namespace; None when it is absent and
    the reference optional. Raises `VolumeError` with upstream's message otherwise."""
    assert ctx.objects is not None
    namespace = _namespace(ctx.pod)
    try:
        if kind == "configmap":
            obj = await ctx.objects.get_configmap(namespace, name)
        else:
            obj = await ctx.objects.get_secret(namespace, name)
    except ObjectUnavailable as err:
        raise VolumeError(str(err)) from err
    if obj is None and not optional:
        raise VolumeError(f'{kind} "{name}" not found')
    return obj


async def _prepare_dir(path: Path, *, tmpfs: bool, ctx: VolumeContext) -> None:
    """The volume directory, with its own tmpfs when `tmpfs` (mounted once: at every later
    sync the directory's device differs from its parent's, two stats, not a read of the
    mount table). A fresh directory gets mode 0755; later syncs leave it as the fsGroup
    ownership made it."""
    fresh = await asyncio.to_thread(_make_dir, path)
    if tmpfs and not fs.likely_mount_point(path):
        fresh = True  # a new filesystem: its root has the kernel's mode
        # sized as upstream sizes the memory emptyDir it wraps (node memory, pod limit)
        size = emptydir.tmpfs_size(ctx.pod, {}, node_memory_bytes=ctx.node.memory_bytes)
        options = (f"size={size}",) if size > 0 else ()
        try:
            await fs.mount_tmpfs(path, options=options)
        except fs.MountError as err:
            raise VolumeError(str(err)) from err
    if fresh:
        await asyncio.to_thread(os.chmod, path, VOLUME_DIR_MODE)


def _make_dir(path: Path) -> bool:
    """Create `path` (and its parents) if missing; True when it was."""
    if path.is_dir():
        return False
    path.mkdir(parents=True, exist_ok=True)
    return True


def _write_sync(path: Path, payload: dict[str, FileProjection], gid: int | None) -> bool:
    def set_perms(root: Path) -> None:
        if gid is not None:
            atomic.set_group_ownership(root, gid)

    try:
        return atomic.write(path, payload, set_perms=set_perms)
    except atomic.PayloadError as err:
        raise VolumeError(str(err)) from err


async def _store(
    path: Path, payload: dict[str, FileProjection], *, tmpfs: bool, ctx: VolumeContext
) -> Path:
    await _prepare_dir(path, tmpfs=tmpfs, ctx=ctx)
    await asyncio.to_thread(_write_sync, path, payload, emptydir.fs_group(ctx.pod))
    return path


async def _remove(path: Path) -> None:
    problems = await fs.remove_tree(path)
    if problems:
        raise OSError("; ".join(problems))


def _default_mode(source: JSON) -> int:
    return payloads.mode_of(source.get("defaultMode"), payloads.DEFAULT_MODE)


class _ContentPlugin(ABC):
    """Set-up and tear-down shared by the content plugins: the payload a subclass
    builds is stored with the atomic writer, on a tmpfs unless `on_disk`."""

    dir_name = ""
    on_disk = False

    @abstractmethod
    def handles(self, volume: JSON) -> bool: ...

    @abstractmethod
    async def payload(self, volume: JSON, ctx: VolumeContext) -> dict[str, FileProjection]: ...

    async def set_up(self, volume: JSON, ctx: VolumeContext) -> Path:
        payload = await self.payload(volume, ctx)
        path = ctx.volume_dir(self, str(volume["name"]))
        return await _store(path, payload, tmpfs=not self.on_disk, ctx=ctx)

    async def tear_down(self, path: Path) -> None:
        # Its own tmpfs unmounted and the directory rmdir'ed, without the mount table;
        # anything else there (a mount below, files under the tmpfs) the careful way.
        if not self.on_disk and await fs.remove_own_mount(path):
            return
        await _remove(path)


class ConfigMapPlugin(_ContentPlugin):
    dir_name = "kubernetes.io~configmap"
    on_disk = True  # as upstream: only secrets, downward API and projected use tmpfs

    def handles(self, volume: JSON) -> bool:
        return volume.get("configMap") is not None

    async def payload(self, volume: JSON, ctx: VolumeContext) -> dict[str, FileProjection]:
        """The volume's files, read from the apiserver; raises `VolumeError`."""
        source = volume["configMap"]
        if ctx.objects is None:
            raise _no_client("configMap", volume)
        obj = await _read(
            ctx, "configmap", str(source.get("name", "")), optional=bool(source.get("optional"))
        )
        return payloads.configmap_payload(obj, source, default_mode=_default_mode(source))


class SecretPlugin(_ContentPlugin):
    dir_name = "kubernetes.io~secret"

    def handles(self, volume: JSON) -> bool:
        return volume.get("secret") is not None

    async def payload(self, volume: JSON, ctx: VolumeContext) -> dict[str, FileProjection]:
        """The volume's files, read from the apiserver; raises `VolumeError`."""
        source = volume["secret"]
        if ctx.objects is None:
            raise _no_client("secret", volume)
        obj = await _read(
            ctx, "secret", str(source.get("secretName", "")), optional=bool(source.get("optional"))
        )
        return payloads.secret_payload(obj, source, default_mode=_default_mode(source))


class DownwardAPIPlugin(_ContentPlugin):
    dir_name = "kubernetes.io~downward-api"

    def handles(self, volume: JSON) -> bool:
        return volume.get("downwardAPI") is not None

    async def payload(self, volume: JSON, ctx: VolumeContext) -> dict[str, FileProjection]:
        """The volume's files, from the pod; raises `VolumeError`."""
        source = volume["downwardAPI"]
        return payloads.downward_payload(
            source.get("items") or [],
            ctx.pod,
            node=ctx.node,
            default_mode=_default_mode(source),
        )


class ProjectedPlugin(_ContentPlugin):
    """Projected volumes; the tokens they hold are forgotten with the pod's volumes."""

    dir_name = "kubernetes.io~projected"

    def __init__(self, *, forget_tokens: ForgetTokens | None = None) -> None:
        self.forget_tokens = forget_tokens

    def handles(self, volume: JSON) -> bool:
        return volume.get("projected") is not None

    async def payload(self, volume: JSON, ctx: VolumeContext) -> dict[str, FileProjection]:
        """Every source's files in one payload; every failing source in one error."""
        source = volume["projected"]
        if ctx.objects is None or ctx.tokens is None:
            raise _no_client("projected", volume)
        default_mode = _default_mode(source)
        payload: dict[str, FileProjection] = {}
        errors: list[str] = []
        for projection in source.get("sources") or []:
            try:
                payload.update(await self._one(projection, ctx, default_mode))
            except VolumeError as err:
                errors.append(str(err))
        if errors:
            raise VolumeError(payloads.aggregate(errors))
        return payload

    async def _one(
        self, projection: JSON, ctx: VolumeContext, default_mode: int
    ) -> dict[str, FileProjection]:
        if projection.get("configMap") is not None:
            ref = projection["configMap"]
            obj = await _read(
                ctx, "configmap", str(ref.get("name", "")), optional=bool(ref.get("optional"))
            )
            return payloads.configmap_payload(obj, ref, default_mode=default_mode)
        if projection.get("secret") is not None:
            ref = projection["secret"]
            obj = await _read(
                ctx, "secret", str(ref.get("name", "")), optional=bool(ref.get("optional"))
            )
            return payloads.secret_payload(obj, ref, default_mode=default_mode)
        if projection.get("downwardAPI") is not None:
            return payloads.downward_payload(
                projection["downwardAPI"].get("items") or [],
                ctx.pod,
                node=ctx.node,
                default_mode=default_mode,
            )
        if projection.get("serviceAccountToken") is not None:
            return await self._token(projection["serviceAccountToken"], ctx, default_mode)
        kind = next((k for k in projection if projection[k] is not None), "")
        raise VolumeError(f"projected volume source {kind!r} is not supported by klet")

    async def _token(
        self, ref: JSON, ctx: VolumeContext, default_mode: int
    ) -> dict[str, FileProjection]:
        assert ctx.tokens is not None
        spec = ctx.pod.get("spec") or {}
        account = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        expiration = ref.get("expirationSeconds")
        try:
            token, _ = await ctx.tokens.token(
                ctx.pod,
                service_account=account,
                audience=str(ref.get("audience") or ""),
                expiration_s=int(expiration or payloads.DEFAULT_TOKEN_EXPIRATION_S),
            )
        except TokenError as err:
            raise VolumeError(str(err)) from err
        return {
            str(ref.get("path", "")): FileProjection(
                token.encode(),
                payloads.token_mode(ctx.pod, default_mode),
                fs_user=payloads.fs_user(ctx.pod),
            )
        }

    async def tear_down(self, path: Path) -> None:
        await super().tear_down(path)
        if self.forget_tokens is not None:
            # <root>/pods/<uid>/volumes/kubernetes.io~projected/<name>
            self.forget_tokens(path.parent.parent.parent.name)

"""The manifest URL's body bound holds after decoding: identity, gzip and deflate bodies
are decoded up to the limit, a small gzip body that inflates past it is refused as
`too_large` without inflating it whole, truncated or corrupt compressed data and
encodings other than gzip and deflate are read errors naming the cause."""

from __future__ import annotations

import gzip
import zlib

import pytest
from klet.pod_source.manifests import ManifestError
from klet.pod_source.sources.http import BoundedBody

LIMIT = 1000


def feed(encoding: str, data: bytes, *, step: int = 7) -> bytes:
    body = BoundedBody(encoding, limit=LIMIT)
    for i in range(0, len(data), step):
        body.add(data[i : i + step])
    return body.finish()


@pytest.mark.parametrize("encoding", ["", "identity", "gzip", "x-gzip", "deflate", "GZIP"])
def test_bodies_within_the_limit_are_decoded(encoding: str) -> None:
    plain = b"x" * LIMIT
    name = encoding.lower()
    if name in ("gzip", "x-gzip"):
        data = gzip.compress(plain)
    elif name == "deflate":
        data = zlib.compress(plain)
    else:
        data = plain
    assert feed(encoding, data) == plain


def test_an_empty_compressed_body_is_empty() -> None:
    assert feed("gzip", b"") == b""


@pytest.mark.parametrize("encoding", ["", "gzip", "deflate"])
def test_a_body_past_the_limit_is_too_large(encoding: str) -> None:
    plain = b"y" * (LIMIT + 1)
    data = {"": plain, "gzip": gzip.compress(plain), "deflate": zlib.compress(plain)}[encoding]
    with pytest.raises(ManifestError) as err:
        feed(encoding, data)
    assert err.value.reason == "too_large"


def test_a_bomb_is_refused_without_being_inflated() -> None:
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in about 64 KiB
    assert len(bomb) < 128 << 10
    body = BoundedBody("gzip", limit=LIMIT)
    with pytest.raises(ManifestError) as err:
        body.add(bomb)  # one chunk: the whole bomb at once
    assert err.value.reason == "too_large"
    assert len(body._data) <= LIMIT + 1


@pytest.mark.parametrize(
    ("encoding", "data", "words"),
    [
        ("br", b"...", "Content-Encoding 'br' not supported"),
        ("gzip, gzip", b"...", "not supported"),
        ("gzip", b"not gzip at all", "not valid compressed data"),
        ("gzip", gzip.compress(b"z" * 100)[:-12], "ends early"),
    ],
)
def test_unsupported_or_broken_encodings_are_read_errors(
    encoding: str, data: bytes, words: str
) -> None:
    with pytest.raises(ManifestError) as err:
        feed(encoding, data)
    assert err.value.reason == "read" and words in err.value.message

"""The claim manager's apiserver reader (klet.syncloop.dra.apiclaims.ApiClaims) over a
recording stand-in of klet.kube's client: the resource.k8s.io/v1 path with the
namespace and name escaped, every read going to the apiserver (no cache), and a
missing claim, an apiserver error or an answer that is not an object each a
ClaimReadError (a LookupError) carrying the apiserver's words."""

from __future__ import annotations

from typing import Any

import pytest
from klet.kube import NotFound, Unavailable
from klet.syncloop.dra.apiclaims import ApiClaims, ClaimReadError


class Kube:
    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.paths: list[str] = []

    async def get(self, path: str, **params: Any) -> Any:
        self.paths.append(path)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_each_read_asks_the_apiserver_for_the_v1_claim() -> None:
    claim = {"metadata": {"name": "gpu", "namespace": "ns"}}
    kube = Kube(claim, claim)
    claims = ApiClaims(kube)
    assert await claims.resource_claim("ns", "gpu") == claim
    assert await claims.resource_claim("ns", "gpu") == claim
    assert kube.paths == ["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/gpu"] * 2


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (NotFound('resourceclaims.resource.k8s.io "gpu" not found', status=404), "not found"),
        (Unavailable("connection refused"), "connection refused"),
        (["not", "an", "object"], "the answer is list"),
    ],
    ids=["absent", "apiserver down", "not an object"],
)
async def test_a_claim_that_cannot_be_read_is_a_lookup_error_saying_why(
    answer: Any, words: str
) -> None:
    with pytest.raises(ClaimReadError, match=words) as caught:
        await ApiClaims(Kube(answer)).resource_claim("ns", "gpu")
    assert isinstance(caught.value, LookupError)

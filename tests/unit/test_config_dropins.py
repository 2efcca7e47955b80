"""`--config-dir`: KubeletConfiguration drop-ins merged over `--config` as upstream's
kubelet merges them (klet.config.dropins): the walk order, RFC 7386 merge patches over
the defaulted configuration, strict decoding of each drop-in, flags over the result, and
problems naming the drop-in they come from."""

from __future__ import annotations

from pathlib import Path

import pytest
from klet.config import ConfigError
from klet.config.dropins import apply_drop_ins, drop_in_files, merge_patch
from klet.config.kubelet import KubeletConfiguration
from klet.config.settings import load_settings

HEAD = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def write(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEAD + body)
    return path


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        # RFC 7386's appendix, a selection
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_follows_rfc_7386(target: object, patch: object, expected: object) -> None:
    assert merge_patch(target, patch) == expected


def test_the_walk_is_lexical_and_depth_first_and_reads_only_conf_files(tmp_path: Path) -> None:
    for name in (
        "30-c.conf",
        "10-a.conf",
        "20-b/05-x.conf",
        "20-b/99-y.conf",
        "15.yaml",
        "z.conf.bak",
    ):
        write(tmp_path / name, "")
    assert [p.relative_to(tmp_path).as_posix() for p in drop_in_files(tmp_path)] == [
        "10-a.conf",
        "20-b/05-x.conf",
        "20-b/99-y.conf",
        "30-c.conf",
    ]


def test_later_drop_ins_win_maps_merge_with_the_defaults_and_null_restores_a_default(
    tmp_path: Path,
) -> None:
    base = KubeletConfiguration(max_pods=50, sync_frequency=30.0)
    write(tmp_path / "10-a.conf", "maxPods: 70\nevictionHard:\n  memory.available: 300Mi\n")
    write(tmp_path / "20-b.conf", "maxPods: 80\nsyncFrequency: null\n")
    result = apply_drop_ins(base, tmp_path)
    assert result.problems == []
    cfg = result.config
    assert cfg.max_pods == 80
    assert cfg.sync_frequency == KubeletConfiguration().sync_frequency
    # a merge patch merges objects: the other defaulted thresholds stay
    assert cfg.eviction_hard == {
        **KubeletConfiguration().eviction_hard,
        "memory.available": "300Mi",
    }
    assert result.file_for("maxPods") == tmp_path / "20-b.conf"
    assert result.file_for("evictionHard.memory.available") == tmp_path / "10-a.conf"
    assert result.file_for("podPidsLimit") is None


def test_a_bad_drop_in_is_left_out_naming_it_and_the_others_apply(tmp_path: Path) -> None:
    write(tmp_path / "10-a.conf", "maxPods: 70\n")
    write(tmp_path / "20-b.conf", "maxPods: 90\nbogus: 1\n")
    (tmp_path / "30-c.conf").write_text("maxPods: 91\n")  # no apiVersion and kind
    (tmp_path / "40-d.conf").write_text(HEAD + "maxPods: [\n")
    result = apply_drop_ins(KubeletConfiguration(), tmp_path)
    assert result.config.max_pods == 70
    text = [str(p) for p in result.problems]
    assert f"{tmp_path / '20-b.conf'}: bogus: unknown field" in text
    assert any(t.startswith(f"{tmp_path / '30-c.conf'}: apiVersion: must be") for t in text)
    assert any(t.startswith(f"{tmp_path / '40-d.conf'}: cannot parse") for t in text)


def test_a_missing_directory_is_a_problem_naming_it(tmp_path: Path) -> None:
    result = apply_drop_ins(KubeletConfiguration(), tmp_path / "absent")
    assert [str(p) for p in result.problems] == [
        f"--config-dir: cannot read {tmp_path / 'absent'}: No such file or directory"
    ]
    assert result.config == KubeletConfiguration()


def test_load_settings_merges_the_directory_over_the_file_and_flags_over_both(
    tmp_path: Path,
) -> None:
    main = write(tmp_path / "kubelet.yaml", "maxPods: 50\nsyncFrequency: 20s\n")
    write(tmp_path / "conf.d" / "10-pods.conf", "maxPods: 70\nsyncFrequency: 40s\n")
    argv = ["--config", str(main), "--config-dir", str(tmp_path / "conf.d")]
    settings = load_settings([*argv, "--max-pods=90"], env={}, service="syncloop", hostname="n1")
    assert settings.kubelet.max_pods == 90
    assert settings.kubelet.sync_frequency == 40.0
    assert settings.klet.config_dir == tmp_path / "conf.d"


def test_a_validation_problem_names_the_drop_in_that_set_the_field(tmp_path: Path) -> None:
    main = write(tmp_path / "kubelet.yaml", "maxPods: 50\n")
    bad = write(tmp_path / "conf.d" / "10-pods.conf", "maxPods: -3\n")
    with pytest.raises(ConfigError) as err:
        load_settings(
            ["--config", str(main), "--config-dir", str(tmp_path / "conf.d")],
            env={},
            service="syncloop",
            hostname="n1",
        )
    assert any(p.startswith(f"{bad}: maxPods:") for p in err.value.problems), err.value.problems

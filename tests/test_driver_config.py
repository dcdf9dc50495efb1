"""``toposlice run`` flags: environment variables, derived defaults, refusals at the edge."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from driver.config import DaemonConfig, add_driver_args, load_config
from driver.plumbing.checks import ConfigError
from toposlice.sources import add_normalize_args, add_source_args, normalize_options

ENV = (
    "NODE_NAME",
    "KUBECONFIG",
    "DRIVER_NAME",
    "KUBELET_REGISTRAR_DIRECTORY_PATH",
    "KUBELET_PLUGINS_DIRECTORY_PATH",
    "CDI_ROOT",
    "CDI_SPEC_DIRS",
    "STATE_DIR",
    "HTTP_ADDR",
    "PUBLISH",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV:
        monkeypatch.delenv(var, raising=False)


def parse(argv: list[str]) -> DaemonConfig:
    p = argparse.ArgumentParser()
    add_source_args(p)
    add_normalize_args(p, driver_env=True)
    add_driver_args(p)
    args = p.parse_args(argv)
    return load_config(args, "/", False, normalize_options(args))


def test_defaults_follow_the_driver_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # in a pod
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cfg = parse(["--node-name", "n1", "--driver", "net.example.com"])
    assert cfg.driver_name == "net.example.com"
    assert cfg.normalize.driver == "net.example.com"
    assert cfg.registrar_dir == "/var/lib/kubelet/plugins_registry"
    assert cfg.plugins_dir == "/var/lib/kubelet/plugins/net.example.com"
    assert cfg.state_dir == cfg.plugins_dir
    assert cfg.cdi_root == "/var/run/cdi"
    assert cfg.cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi")  # the cdi root is among them
    assert cfg.kubeconfig is None  # in-cluster
    assert cfg.http_addr is None
    assert cfg.publish == {"gpu", "nic", "cpu"}


def test_environment_and_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kc = tmp_path / "kc"
    kc.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    monkeypatch.setenv("NODE_NAME", "from-env")
    monkeypatch.setenv("KUBECONFIG", str(kc))
    monkeypatch.setenv("PUBLISH", "nic")
    monkeypatch.setenv("LOG_FORMAT", "json")
    monkeypatch.setenv("CDI_ROOT", str(tmp_path / "cdi"))
    cfg = parse([])
    assert (cfg.node_name, cfg.kubeconfig, cfg.publish) == ("from-env", str(kc), {"nic"})
    assert cfg.log_format == "json" and cfg.cdi_root == str(tmp_path / "cdi")
    assert cfg.cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi", str(tmp_path / "cdi"))
    monkeypatch.setenv("CDI_SPEC_DIRS", f"{tmp_path}/a, {tmp_path}/b")
    assert parse([]).cdi_spec_dirs == (f"{tmp_path}/a", f"{tmp_path}/b", str(tmp_path / "cdi"))
    assert parse(["--cdi-spec-dirs", ""]).cdi_spec_dirs == (str(tmp_path / "cdi"),)
    assert parse(["--node-name", "from-flag", "--publish", "gpu,cpu"]).node_name == "from-flag"
    assert parse(["--publish", "gpu,cpu"]).publish == {"gpu", "cpu"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "--node-name is required"),
        (["--node-name", "BAD_Name"], "not a valid Kubernetes node name"),
        (["--node-name", "n1", "--driver", "bad_driver"], "--driver 'bad_driver'.*DNS-1123"),
        (["--node-name", "n1", "--driver", "Upper.example.com"], "lower case"),
        (["--node-name", "n1", "--publish", "gpu,fpga"], "--publish"),
        (["--node-name", "n1", "--publish", ""], "--publish"),
        (["--node-name", "n1", "--http-addr", "localhost"], "--http-addr"),
        (["--node-name", "n1", "--kubeconfig", "/nonexistent/kc"], "no such file"),
        (["--node-name", "n1"], "give --kubeconfig FILE or set \\$KUBECONFIG"),
        (["--node-name", "n1", "--http-addr", ":99999"], "port of 0-65535"),
        (
            ["--node-name", "n1", "--kubelet-plugins-directory-path", "/" + "p" * 120],
            "longer than 107 bytes",
        ),
    ],
)
def test_refusals(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        parse(argv)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: [\n", "not valid YAML: .* at line 2, column 1"),
        ('"just a string"\n', "not a kubeconfig .* got a str"),
    ],
)
def test_unloadable_kubeconfig_is_refused_in_one_line(
    tmp_path: Path, text: str, needle: str
) -> None:
    kc = tmp_path / "kc.yaml"
    kc.write_text(text)
    with pytest.raises(ConfigError, match=needle) as err:
        parse(["--node-name", "n1", "--kubeconfig", str(kc)])
    assert str(kc) in str(err.value) and "\n" not in str(err.value)

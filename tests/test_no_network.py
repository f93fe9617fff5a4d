"""No network: the launcher says in seconds, in one line, what it could not reach (issue 30: a dry run without
network hung for minutes in the storage client's retries, then printed chained tracebacks)."""

from __future__ import annotations

import re
import socket

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import cloud
from pipeline.errors import UserError
from tests.conftest import cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


@pytest.mark.timeout(120)
def test_a_run_on_gcs_without_a_reachable_storage_is_one_line_and_exit_2(tmp_path):
    port = _closed_port()
    result = cli("pipeline.main", "--input_dir=gs://bkt/photos", "--output_dir=gs://bkt/out",
                 env={"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: Cloud Storage cannot be reached at 127.0.0.1:{port} (Connection refused): check this machine's "
        "network connection, DNS and firewall (and HTTPS_PROXY if you need a proxy); a dry run reaches Cloud "
        "Storage too, to check the folders")
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("error, reason", [
    (socket.gaierror(-2, "Name or service not known"), "(Name or service not known)"),
    (TimeoutError(), "(no answer in 5 s)"),
])
def test_a_missing_network_names_what_was_being_reached(monkeypatch, error, reason):
    tried = []

    def refuse(address, timeout):
        tried.append((address, timeout))
        raise error

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    for name in cloud.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cloud.socket, "create_connection", refuse)
    expected = f"Cloud Storage cannot be reached at storage.googleapis.com:443 {reason}: check"
    with pytest.raises(UserError, match="^" + re.escape(expected)):
        cloud.check_network(PipelineOptions([]), ["gs://b/in", "/local/out"])
    assert tried == [(("storage.googleapis.com", 443), cloud.NETWORK_TIMEOUT_S)]


def test_the_dataflow_endpoint_and_a_proxy_are_what_is_reached(monkeypatch):
    tried = []
    monkeypatch.setattr(cloud.socket, "create_connection", lambda address, timeout: tried.append(address) or
                        socket.socket())
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    options = PipelineOptions(["--runner=DataflowRunner", "--dataflow_endpoint=https://df.example:8443",
                               "--temp_location=gs://b/tmp"])
    cloud.check_network(options, ["/local/in", None])
    assert tried == [("proxy.corp", 3128), ("proxy.corp", 3128)]


def test_local_folders_reach_nothing(monkeypatch):
    monkeypatch.setattr(cloud.socket, "create_connection", lambda *a, **k: pytest.fail("no network for local"))
    cloud.check_network(PipelineOptions([]), ["/in", "/out", None])

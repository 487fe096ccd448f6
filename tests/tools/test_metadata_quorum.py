"""``kbroker metadata-quorum`` without a cluster: option errors and the dry runs, which read
a controller's own properties and meta.properties (the real add/remove/describe runs are in
tests/cluster/test_kraft_dynamic_quorum.py)."""
import contextlib
import io
import os

from kbroker.tools import metadata_quorum, storage


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    rc = metadata_quorum.main(list(argv), out, err)
    return rc, out.getvalue(), err.getvalue()


def _controller(tmp_path, node_id=2, port=19093):
    conf = tmp_path / "controller.properties"
    conf.write_text(f"process.roles=controller\nnode.id={node_id}\n"
                    f"controller.quorum.bootstrap.servers=127.0.0.1:{port}\n"
                    f"listeners=CONTROLLER://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\n"
                    f"log.dirs={tmp_path / 'logs'}\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert storage.main(["format", "-c", str(conf), "-t", "MkU3OEVBNTcwNTJENDM2Qg",
                             "--no-initial-controllers"]) == 0
    props = dict(l.split("=", 1) for l in (tmp_path / "logs" / "meta.properties").read_text().splitlines()
                 if "=" in l)
    return str(conf), props["directory.id"]


def test_add_controller_dry_run_reads_the_controller_config(tmp_path):
    conf, directory = _controller(tmp_path)
    rc, out, err = run("--bootstrap-controller", "127.0.0.1:1", "--command-config", conf, "add-controller",
                       "--dry-run")
    assert rc == 0, err
    assert out.strip() == (f"DRY RUN of adding controller 2 with directory id {directory} and endpoints: "
                           "CONTROLLER://127.0.0.1:19093")


def test_remove_controller_dry_run_and_errors(tmp_path):
    rc, out, _ = run("--bootstrap-controller", "127.0.0.1:1", "remove-controller", "--controller-id", "3",
                     "--controller-directory-id", "AAAAAAAAAAAAAAAAAAAAAQ", "--dry-run")
    assert rc == 0 and out.strip() == "DRY RUN of removing  KRaft controller 3 with directory id AAAAAAAAAAAAAAAAAAAAAQ"
    rc, _, err = run("--bootstrap-controller", "127.0.0.1:1", "remove-controller", "--controller-id", "-1",
                     "--controller-directory-id", "AAAAAAAAAAAAAAAAAAAAAQ")
    assert rc == 1 and err.strip() == "Error: Invalid negative --controller-id: -1"
    rc, _, err = run("--bootstrap-controller", "127.0.0.1:1", "remove-controller", "--controller-id", "1",
                     "--controller-directory-id", "nope")
    assert rc == 1 and err.startswith("Error: Failed to parse --controller-directory-id")
    rc, _, err = run("describe", "--status")
    assert rc == 1 and "One of --bootstrap-server or --bootstrap-controller must be specified" in err
    rc, _, err = run("--bootstrap-controller", "127.0.0.1:1", "describe")
    assert rc == 1 and "One of --status or --replication" in err
    rc, _, err = run("--bootstrap-controller", "127.0.0.1:1", "add-controller")
    assert rc == 1 and "--command-config" in err


def test_help_lists_the_commands_and_options():
    rc, out, err = run("--help")
    assert rc == 0, err
    assert "Commands: describe (--status | --replication), add-controller, remove-controller" in out
    assert "--bootstrap-controller" in out and "--controller-directory-id" in out
    rc, _, err = run("--bootstrap-controller", "127.0.0.1:1", "describe", "add-controller")
    assert rc == 1 and "only one command" in err

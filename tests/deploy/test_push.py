"""`teye dashboards push` against a fake Grafana that records the requests it is sent (Grafana's HTTP API through
teye.grafana, standard library only: no extra needed)."""
from __future__ import annotations


import pytest

from agent.cli import main as teye
from dashboards.push import annotate, load_dashboards
from tests.procs import free_port

from .fake_grafana import FakeGrafana

UIDS = ["teye-cluster", "teye-node", "teye-job"]
TITLES = {"teye-cluster": "teye / Cluster overview", "teye-node": "teye / Node", "teye-job": "teye / Training job"}


def committed():
    return {d["uid"]: d for d in load_dashboards()}


def push(url, token="good-token", folder=None):
    argv = ["dashboards", "push", "--url", url, "--token", token]
    if folder:
        argv += ["--folder", folder]
    return teye(argv)


def test_push_uploads_every_dashboard_with_overwrite_into_the_folder(capsys):
    with FakeGrafana() as g:
        assert push(g.url, folder="GPU cluster") == 0
        out = capsys.readouterr().out
    posts = g.dashboard_posts()
    assert [p["dashboard"]["uid"] for p in posts] == UIDS
    assert all(p["overwrite"] is True for p in posts)
    assert [f["title"] for f in g.folders] == ["GPU cluster"]
    folder_uid = g.folders[0]["uid"]
    assert all(p["folderUid"] == folder_uid for p in posts)
    assert all(r["auth"] == "Bearer good-token" for r in g.requests)
    # What Grafana stored is the committed JSON (numeric id cleared so Grafana matches by uid).
    want = committed()
    for uid in UIDS:
        stored = dict(g.dashboards[uid]["dashboard"])
        assert stored.pop("id") is None
        assert stored == want[uid]
    assert "uploaded 3 of 3 dashboards: teye-cluster, teye-node, teye-job; not uploaded: none" in out
    for uid in UIDS:
        assert f"/d/{uid}/" in out


def test_second_push_overwrites_by_uid_and_reuses_the_folder(capsys):
    with FakeGrafana() as g:
        assert push(g.url) == 0
        assert push(g.url) == 0
        capsys.readouterr()
    assert len(g.folders) == 1 and g.folders[0]["title"] == "teye"
    folder_posts = [r for r in g.requests if r["method"] == "POST" and r["path"] == "/api/folders"]
    assert len(folder_posts) == 1                      # created once, found the second time
    assert sorted(g.dashboards) == sorted(UIDS)        # still three dashboards, not six
    assert all(g.dashboards[uid]["version"] == 2 for uid in UIDS)
    assert len(g.dashboard_posts()) == 6 and all(p["overwrite"] for p in g.dashboard_posts())


def test_bad_token_exits_1_naming_the_dashboard_and_reporting_nothing_uploaded(capsys):
    with FakeGrafana(token="the-real-one") as g:
        assert push(g.url, token="wrong") == 1
        err = capsys.readouterr().err
    assert not g.dashboards
    assert "dashboard 'teye / Cluster overview' (uid teye-cluster) not uploaded" in err
    assert "rejected the token (401 Unauthorized)" in err
    assert "uploaded 0 of 3 dashboards: none; not uploaded: teye-cluster, teye-node, teye-job" in err
    # It stopped at the first 401: no dashboard was even tried.
    assert not g.dashboard_posts()


def test_unreachable_grafana_exits_1_naming_the_dashboard(capsys):
    port = free_port()  # a port nobody listens on
    assert push(f"http://127.0.0.1:{port}") == 1
    err = capsys.readouterr().err
    assert "dashboard 'teye / Cluster overview' (uid teye-cluster) not uploaded" in err
    assert f"cannot reach Grafana at http://127.0.0.1:{port}" in err
    assert "uploaded 0 of 3 dashboards: none; not uploaded: teye-cluster, teye-node, teye-job" in err
    assert len(err.strip().splitlines()) == 2  # one error line, one report line


@pytest.mark.parametrize("status,message", [(412, "version-mismatch: the dashboard has been changed by someone else"),
                                            (400, "Dashboard title cannot be empty")])
def test_one_rejected_dashboard_is_named_and_the_others_are_uploaded(capsys, status, message):
    with FakeGrafana(reject={"teye-node": (status, message)}) as g:
        assert push(g.url) == 1
        cap = capsys.readouterr()
    assert sorted(g.dashboards) == ["teye-cluster", "teye-job"]
    assert f"teye: dashboard 'teye / Node' (uid teye-node) not uploaded: Grafana rejected it ({status}: {message})" \
        in cap.err
    assert "uploaded 2 of 3 dashboards: teye-cluster, teye-job; not uploaded: teye-node" in cap.err
    assert "uploaded 'teye / Cluster overview'" in cap.out and "uploaded 'teye / Training job'" in cap.out


def test_not_an_http_url_is_a_usage_error(capsys):
    assert push("grafana.example:3000") == 2
    assert "--url must be an http(s) URL" in capsys.readouterr().err


def test_annotate_posts_tags_the_job_dashboard_filters_on():
    with FakeGrafana() as g:
        resp = annotate(g.url, "good-token", "resnet50-bs64", "epoch 3", kind="epoch", time_ms=1_700_000_000_000)
    assert resp == {"id": 1, "message": "Annotation added"}
    assert g.annotations == [{"panelId": None, "time": 1_700_000_000_000, "timeEnd": None,
                              "tags": ["teye", "resnet50-bs64", "epoch"], "text": "epoch 3"}]
    # The training-job dashboard shows annotations tagged "teye" and the train_job name.
    job = committed()["teye-job"]
    tag_queries = [a for a in job["annotations"]["list"] if a.get("type") == "tags"]
    assert tag_queries and tag_queries[0]["target"]["tags"] == ["teye", "$train_job"]


def test_annotate_never_raises_when_grafana_is_down():
    port = free_port()  # a port nobody listens on
    assert annotate(f"http://127.0.0.1:{port}", "t", "job", "start", kind="start") is None


def test_without_the_json_files_the_dashboards_are_generated(tmp_path):
    """An installed wheel ships no dashboards/json: push then builds the same dashboards from code."""
    from dashboards.push import load_dashboards
    got = load_dashboards(str(tmp_path))
    assert [d["uid"] for d in got] == UIDS
    assert {d["uid"]: d for d in got} == committed()


def test_token_from_a_file_or_the_environment_not_only_the_command_line(tmp_path, monkeypatch, capsys):
    """--token-file (first line) and $GRAFANA_TOKEN reach Grafana as the bearer token; --token-file wins over
    the environment; no token at all, an unreadable or empty file: exit 2 with the reason, nothing sent."""
    f = tmp_path / "token"
    f.write_text("file-token\n")
    monkeypatch.setenv("GRAFANA_TOKEN", "env-token")
    with FakeGrafana(token="file-token") as g:
        assert teye(["dashboards", "push", "--url", g.url, "--token-file", str(f)]) == 0
    assert g.requests and all(r["auth"] == "Bearer file-token" for r in g.requests)
    with FakeGrafana(token="env-token") as g:
        assert teye(["dashboards", "push", "--url", g.url]) == 0
    assert g.requests and all(r["auth"] == "Bearer env-token" for r in g.requests)
    capsys.readouterr()
    monkeypatch.delenv("GRAFANA_TOKEN")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with FakeGrafana() as g:
        assert teye(["dashboards", "push", "--url", g.url]) == 2
        assert "no Grafana token: pass --token-file FILE or set GRAFANA_TOKEN" in capsys.readouterr().err
        assert teye(["dashboards", "push", "--url", g.url, "--token-file", str(tmp_path / "nope")]) == 2
        assert f"cannot read the token file {tmp_path / 'nope'}: No such file or directory" in capsys.readouterr().err
        assert teye(["dashboards", "push", "--url", g.url, "--token-file", str(empty)]) == 2
        assert f"the token file {empty} is empty" in capsys.readouterr().err
    assert g.requests == []


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(capsys):
    """A Grafana URL that redirects (to another host here) stops the push: the token is never sent there."""
    import http.server
    import threading
    seen = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"[]")

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirect(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}{self.path}")
            self.end_headers()
        do_POST = do_GET

    here = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for srv in (other, here):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert push(f"http://127.0.0.1:{here.server_port}", token="secret") == 1
        from teye.grafana import annotate as public_annotate
        assert public_annotate(f"http://127.0.0.1:{here.server_port}", "secret", "j", "x") is None
    finally:
        here.shutdown()
        other.shutdown()
    err = capsys.readouterr().err
    assert "answered with a redirect (302), not followed" in err
    assert seen == []


def test_the_public_annotate_is_the_one_the_dashboards_module_has():
    """``from teye.grafana import annotate`` (what an install documents) posts what dashboards.push.annotate does."""
    from teye.grafana import annotate as public_annotate
    with FakeGrafana() as g:
        assert public_annotate(g.url, "good-token", "job-a", "start", kind="start", time_ms=5) == \
            {"id": 1, "message": "Annotation added"}
        assert public_annotate(g.url, "bad-token", "job-a", "start") is None     # refused: None, never raises
    assert g.annotations == [{"panelId": None, "time": 5, "timeEnd": None, "tags": ["teye", "job-a", "start"],
                              "text": "start"}]

"""API keys, the admin key, tenants and their cache namespaces, the per-tenant cap, TLS.

Peers as oracles: the openai SDK (its api_key, its AuthenticationError / PermissionDeniedError /
RateLimitError for 401 / 403 / 429, its usage.prompt_tokens_details.cached_tokens) and radixlang's own
Endpoint client; the cache's namespaces are read from the engine's radix tree, and the KV invariant holds
after each scenario (the `server` fixtures check it)."""
from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
import time

import httpx
import pytest

import radixlang as rl
from radixlang.runtime.namespace import DEFAULT_NAMESPACE
from radixlang.server.auth import AuthConfig, key_tenant_id, read_keys_file, request_key

openai = pytest.importorskip("openai", reason="the openai SDK is the peer client")

A, B, ADMIN = "key-of-alice", "key-of-bob", "the-admin-key"
GREEDY = {"temperature": 0, "max_new_tokens": 2}
LONG = {"max_new_tokens": 8000, "ignore_eos": True}  # runs until aborted (> 10 s on any CPU)
CAP = 2


@pytest.fixture(scope="module")
def keyed(long_tiny_model_dir):
    from tests.server.conftest import serving

    auth = AuthConfig({A: "alice", B: key_tenant_id(B)}, (ADMIN,), max_requests_per_tenant=CAP)
    with serving(long_tiny_model_dir, auth=auth, kv_cache_tokens=3 * LONG["max_new_tokens"]) as live:
        yield live


@pytest.fixture
def srv(keyed):
    yield keyed
    keyed.wait_idle()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def namespaces(live) -> list:
    engine = live.engine
    return engine._thread.query(lambda: engine.scheduler.kv.cache.namespaces)


def prompt(seed: int, n: int = 600) -> list[int]:
    """n token ids no other test sends (ids of the tiny model's real vocabulary)."""
    return [1000 + (seed * 7919 + 13 * i) % 20000 for i in range(n)]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}]}),
    ("/generate", {"text": "hi", "sampling_params": GREEDY}),
    ("/v1/programs", {"program": {}, "args": {}}),
])
def test_no_key_or_a_wrong_key_is_a_401_with_an_openai_error(srv, path, body):
    with srv.client() as http:
        for headers in ({}, bearer("wrong"), {"x-api-key": "wrong"}, {"Authorization": f"Basic {A}"}):
            r = http.post(path, json=body, headers=headers)
            assert r.status_code == 401, (headers, r.text)
            error = r.json()["error"]
            assert error["type"] == "authentication_error" and error["code"] == 401 and "API key" in error["message"]
            assert A not in r.text and "wrong" not in r.text  # keys are never echoed
        r = http.post("/generate", json={"text": "hi", "sampling_params": GREEDY}, headers={"x-api-key": A})
        assert r.status_code == 200  # Anthropic's header works too


def test_health_is_open_and_admin_routes_need_the_admin_key(srv):
    with srv.client() as http:
        assert http.get("/health").status_code == 200
        assert http.get("/v1/models").status_code == 401
        for path in ("/flush_cache", "/start_profile", "/stop_profile", "/update_weights_from_disk",
                     "/update_weights_from_tensor", "/pause_generation", "/continue_generation"):
            r = http.post(path, headers=bearer(A))
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", path
        assert http.get("/v1/loads", headers=bearer(B)).status_code == 403
        assert http.post("/abort", json={"abort_all": True}, headers=bearer(A)).status_code == 403
        r = http.post("/flush_cache", headers=bearer(ADMIN))
        assert r.status_code == 200 and r.json() == {"success": True}
        assert http.get("/v1/loads", headers=bearer(ADMIN)).status_code == 200


def test_the_openai_sdk_authenticates_with_its_api_key(srv):
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=A, max_retries=0)
    out = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hello"}],
                                         max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_the_endpoint_client_sends_its_key(srv, monkeypatch):
    monkeypatch.setenv("RADIXLANG_API_KEY", B)
    assert rl.Endpoint(srv.url).model_info()["served_model_name"]  # the key from the environment
    with pytest.raises(PermissionError, match="401"):
        rl.Endpoint(srv.url, api_key="wrong").model_info()


def test_a_tenant_reuses_only_its_own_prefixes(srv):
    """B sends A's 600-token prompt: 0 cached tokens (B computes its own copy), while A's repeat is cached;
    the tree then holds both tenants' namespaces, and a flush empties them all."""
    ids = prompt(1)

    def cached(key: str) -> int:
        with srv.client() as http:
            r = http.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY}, headers=bearer(key))
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]["cached_tokens"]

    assert cached(A) == 0
    assert cached(B) == 0  # A's prompt is in the tree, but not in B's namespace
    assert cached(A) == len(ids) - 1  # all but the last token, recomputed for its logits
    assert cached(B) == len(ids) - 1  # B's own copy
    alice, bob = DEFAULT_NAMESPACE.child("tenant", "alice"), DEFAULT_NAMESPACE.child("tenant", key_tenant_id(B))
    assert {alice, bob} <= set(namespaces(srv))
    srv.wait_idle()  # check_invariants over both namespaces
    # the openai SDK's usage sees the same through chat: B's first try of A's conversation is cold
    messages = [{"role": "user", "content": " ".join(f"topic{i}" for i in range(300))}]
    a_client = openai.OpenAI(base_url=srv.url + "/v1", api_key=A, max_retries=0)
    b_client = openai.OpenAI(base_url=srv.url + "/v1", api_key=B, max_retries=0)
    first = a_client.chat.completions.create(model="default", messages=messages, max_tokens=1)
    assert b_client.chat.completions.create(model="default", messages=messages, max_tokens=1) \
        .usage.prompt_tokens_details.cached_tokens == 0
    assert a_client.chat.completions.create(model="default", messages=messages, max_tokens=1) \
        .usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    with srv.client() as http:
        assert http.post("/flush_cache", headers=bearer(ADMIN)).json() == {"success": True}
    assert namespaces(srv) == [DEFAULT_NAMESPACE]
    assert cached(A) == 0


def test_a_shared_public_prefix_is_reused_across_tenants_and_nothing_after_it(tiny_model_dir, tmp_path):
    """--shared-prefix-file: B reuses the public system prompt A computed, and not one token of A's private
    text after it (cached_tokens is the public prefix's length); each tenant's own repeat is fully cached; the
    answers are the same tokens whichever copy of the KV computed them."""
    from tests.server.conftest import serving

    public = tmp_path / "system.txt"
    public.write_text("<|im_start|>system\nYou are a careful assistant. Answer briefly.<|im_end|>\n")
    auth = AuthConfig({A: "alice", B: "bob"})
    with serving(tiny_model_dir, auth=auth, shared_prefix_file=str(public)) as live:
        prefix = live.engine.tokenizer.encode(public.read_text())
        assert prefix[0] == live.engine.tokenizer.encode("<|im_start|>")[0]  # special tokens written out
        ids = prefix + prompt(11, 120)

        def send(key: str, tokens: list[int]) -> dict:
            with live.client() as http:
                r = http.post("/generate", json={"input_ids": tokens, "sampling_params": GREEDY}, headers=bearer(key))
            assert r.status_code == 200, r.text
            return r.json()

        first = send(A, ids)
        assert first["meta_info"]["cached_tokens"] == 0
        b_first = send(B, ids)
        assert b_first["meta_info"]["cached_tokens"] == len(prefix)  # the public part, none of A's text
        assert b_first["text"] == first["text"]
        assert send(A, ids)["meta_info"]["cached_tokens"] == len(ids) - 1
        assert send(B, ids)["meta_info"]["cached_tokens"] == len(ids) - 1  # B's own copy of the private part
        # a prompt that leaves the public text early shares only what it has of it
        assert send(B, prefix[:3] + prompt(12, 40))["meta_info"]["cached_tokens"] == 3
        live.wait_idle()


def test_a_prompt_cache_key_is_the_tenants_own(srv):
    ids = prompt(2, 200)
    with srv.client() as http:
        r = http.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY, "session": "shared-name"},
                      headers=bearer(A))
        assert r.status_code == 200
        # B, under the same key string, joins nothing: no cached tokens, and its release finds no session
        r = http.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY, "session": "shared-name"},
                      headers=bearer(B))
        assert r.json()["meta_info"]["cached_tokens"] == 0
        assert http.post("/v1/prompt_cache/release", json={"prompt_cache_key": "shared-name"},
                         headers=bearer(B)).json()["released"]  # B's own session, made just now
        assert not http.post("/v1/prompt_cache/release", json={"prompt_cache_key": "shared-name"},
                             headers=bearer(B)).json()["released"]
        r = http.post("/v1/prompt_cache/release", json={"prompt_cache_key": "shared-name"}, headers=bearer(A))
        assert r.json()["released"] and r.json()["tokens"] >= len(ids)  # A's survived B's releases


def test_a_stored_response_is_the_tenants_own(srv):
    """/v1/responses ids are tenant-scoped like prompt_cache_keys: B can neither read, continue nor delete A's
    stored response (and so cannot see A's conversation or reuse A's pinned KV); A can. The openai SDK speaks."""
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key=A, max_retries=0) as alice, \
            openai.OpenAI(base_url=f"{srv.url}/v1", api_key=B, max_retries=0) as bob:
        first = alice.responses.create(model="default", input="a private question", max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError, match="previous_response_id|not stored"):
            bob.responses.create(model="default", input="go on", previous_response_id=first.id, max_output_tokens=2)
        with pytest.raises(openai.NotFoundError):
            bob.responses.delete(first.id)
        follow = alice.responses.create(model="default", input="go on", previous_response_id=first.id,
                                        max_output_tokens=2)
        assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
        assert alice.responses.retrieve(first.id).id == first.id
        alice.responses.delete(first.id)
        alice.responses.delete(follow.id)


def stream(url: str, key: str, rid: str, statuses: list[int]) -> threading.Thread:
    def read() -> None:
        with httpx.Client(base_url=url, timeout=60, headers=bearer(key)) as http, \
                http.stream("POST", "/generate", json={"text": "go", "sampling_params": LONG, "rid": rid,
                                                       "stream": True}) as r:
            statuses.append(r.status_code)
            for _ in r.iter_lines():
                pass

    thread = threading.Thread(target=read)
    thread.start()
    return thread


def wait_running(live, n: int, statuses: list[int]) -> None:
    deadline = time.monotonic() + 30
    while live.engine.stats()["running_requests"] < n:
        assert time.monotonic() < deadline, f"the streams did not start: {statuses}"
        time.sleep(0.02)


def test_rid_aborts_are_scoped_and_a_tenant_past_its_cap_gets_a_429(srv):
    statuses: list[int] = []
    readers = [stream(srv.url, A, f"alice-{i}", statuses) for i in range(CAP)]
    wait_running(srv, CAP, statuses)
    with srv.client() as http:
        r = http.post("/generate", json={"text": "one more", "sampling_params": GREEDY}, headers=bearer(A))
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert http.post("/generate", json={"text": "bob", "sampling_params": GREEDY},
                         headers=bearer(B)).status_code == 200  # another tenant is not capped by A
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key=A, max_retries=0).completions.create(
                model="default", prompt="over the cap", max_tokens=1)
        assert http.get("/v1/models", headers=bearer(A)).status_code == 200  # reads are not capped
        assert http.post("/abort", json={"rid": "alice-0"}, headers=bearer(B)).json() == {"aborted": 0}
        assert srv.engine.stats()["running_requests"] == CAP  # B's abort touched nothing of A's
        assert http.post("/abort", json={"rid": "alice-0"}, headers=bearer(A)).json() == {"aborted": 1}
        assert http.post("/abort", json={"rid": "alice-1"}, headers=bearer(ADMIN)).json() == {"aborted": 1}
    for reader in readers:
        reader.join(30)
    assert statuses == [200] * CAP
    with srv.client() as http:  # the slots came back once the streams ended
        assert http.post("/generate", json={"text": "again", "sampling_params": GREEDY},
                         headers=bearer(A)).status_code == 200


def test_keys_come_from_flags_a_keys_file_and_the_environment(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# tenants\nk1 team-x\nk2 team-x\n\nk3\n")
    assert read_keys_file(keys) == {"k1": "team-x", "k2": "team-x", "k3": key_tenant_id("k3")}
    config = AuthConfig.from_options(["k4"], str(keys), "adm", environ={"RADIXLANG_API_KEY": "k5"})
    assert config.identify("k1") == config.identify("k2") and config.identify("k1").id == "team-x"
    assert config.identify("k4").id == key_tenant_id("k4") != "k4"  # the tenant is named by a hash, not the key
    assert config.identify("k5") is not None and config.identify("adm").admin
    assert config.identify("k4x") is None and config.identify("") is None and config.identify(None) is None
    assert not AuthConfig.from_options(environ={}).enabled
    with pytest.raises(ValueError, match="admin key must differ"):
        AuthConfig.from_options(["same"], admin_key="same", environ={})
    (tmp_path / "bad").write_text("a b c\n")
    with pytest.raises(ValueError, match="KEY TENANT"):
        read_keys_file(tmp_path / "bad")
    # two different keys in one request (a proxy's in front of the client's) are refused, not guessed
    assert request_key([(b"authorization", b"Bearer x"), (b"authorization", b"Bearer y")]) is None
    assert request_key([(b"authorization", b"Bearer x"), (b"x-api-key", b"x")]) == "x"


def _self_signed(tmp_path) -> tuple[str, str]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor openssl is installed")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True)
        return str(key), str(cert)
    import datetime
    import ipaddress

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .sign(private, hashes.SHA256()))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return str(key), str(cert)


def test_tls_serves_https_with_keys(tiny_engine_factory, tmp_path):
    from radixlang.server.launch import background_server

    keyfile, certfile = _self_signed(tmp_path)
    engine = tiny_engine_factory(kv_cache_tokens=1024)
    with background_server(engine, auth=AuthConfig({A: "alice"}), ssl_keyfile=keyfile,
                           ssl_certfile=certfile) as server:
        assert server.url.startswith("https://")
        with httpx.Client(base_url=server.url, verify=ssl.create_default_context(cafile=certfile), timeout=60) as http:
            assert http.get("/health").status_code == 200
            r = http.post("/generate", json={"text": "tls", "sampling_params": GREEDY}, headers=bearer(A))
            assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 2
        with pytest.raises(httpx.TransportError):  # plain HTTP on the TLS port is not served
            httpx.get(server.url.replace("https", "http", 1) + "/health", timeout=10)
    engine.check_invariants()


def test_serve_flags_build_the_keys_and_warn_on_an_open_public_host(caplog, monkeypatch):
    from radixlang.server.cli import _auth, build_parser

    monkeypatch.delenv("RADIXLANG_API_KEY", raising=False)
    monkeypatch.delenv("RADIXLANG_ADMIN_API_KEY", raising=False)
    args = build_parser().parse_args(["serve", "--api-key", "k1", "--api-key", "k2", "--admin-api-key", "adm",
                                      "--max-requests-per-tenant", "3", "--host", "0.0.0.0"])
    with caplog.at_level("WARNING"):
        auth = _auth(args)
    assert set(auth.keys) == {"k1", "k2"} and auth.admin_keys == ("adm",) and auth.max_requests_per_tenant == 3
    assert not caplog.records  # keys given: no warning
    with caplog.at_level("WARNING"):
        open_auth = _auth(build_parser().parse_args(["serve", "--host", "0.0.0.0"]))
    assert not open_auth.enabled and "without API keys" in caplog.text
    assert "k1" not in caplog.text


def test_a_fleet_hands_its_workers_the_keys_off_the_command_line(monkeypatch):
    import os
    import stat

    from radixlang.server import fleet

    spec = fleet.FleetSpec(host="0.0.0.0", port=1, dp=2, worker_args=[], auth=AuthConfig({A: "alice"}, (ADMIN,)),
                           ssl_keyfile="k.pem", ssl_certfile="c.pem")
    launched: list[tuple[list[str], dict[str, str]]] = []
    class Exited:  # a worker process that has already exited
        returncode = 0

        def poll(self) -> int:
            return 0

        def wait(self, timeout: float | None = None) -> int:
            return 0

    def launch(cmd: list[str], env: dict[str, str]) -> Exited:
        launched.append((cmd, env))
        return Exited()

    monkeypatch.setattr(fleet.Fleet, "_launch", staticmethod(launch))
    f = fleet.Fleet(spec)
    f._start_worker(0)
    [(cmd, env)] = launched
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # only the router reaches a worker
    assert A not in cmd and ADMIN not in cmd and env["RADIXLANG_ADMIN_API_KEY"] == ADMIN
    keys_file = cmd[cmd.index("--api-keys-file") + 1]
    assert read_keys_file(__import__("pathlib").Path(keys_file)) == {A: "alice"}
    assert stat.S_IMODE(os.stat(keys_file).st_mode) == 0o600
    router = fleet.router_command(spec, f.worker_urls, 1, "cache_aware", 2)
    assert "--api-key" not in router and ADMIN not in router and A not in router
    assert router[router.index("--tls-cert-path") + 1] == "c.pem" and f.url.startswith("https://")
    f.stop()
    assert not os.path.exists(keys_file)

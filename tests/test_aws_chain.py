"""The AWS credential chain for s3://BUCKET/KEY, each link against a local fake endpoint that
hands out expiring credentials: renewed once under many threads, errors naming the link."""

import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

import boto3
import pytest

from pegasus_cloudio_testbed.ports import free_port
from pegasus_cloudio_testbed.scripted import Reply, ScriptedServer
from transfer import Session, Settings, parse_url
from transfer.backends.aws_chain import aws_s3_config
from transfer.errors import ConfigError


class FakeClock:
    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


def _stamp(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class KeyIssuer:
    """Hands out numbered keys valid for ``lifetime`` seconds of ``clock``; counts issues."""

    def __init__(self, clock, lifetime=600):
        self.clock = clock
        self.lifetime = lifetime
        self.issued = 0
        self._lock = threading.Lock()

    def issue(self):
        with self._lock:
            self.issued += 1
            number = self.issued
        time.sleep(0.05)  # slow enough that racing threads would all ask if nothing stopped them
        return {"AccessKeyId": f"AK{number}", "SecretAccessKey": f"secret{number}", "Token": f"token{number}",
                "Expiration": _stamp(self.clock() + self.lifetime)}


def _hammer(source, threads=32):
    with ThreadPoolExecutor(threads) as pool:
        return {c.access_key for c in pool.map(lambda _i: source(), range(threads * 4))}


def _base_env(tmp_path, **extra):
    return {"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true", **extra}


def _renewal_is_once_and_on_time(config, issuer, clock):
    source = config.source
    assert source().access_key == "AK1" and source().session_token == "token1"
    assert _hammer(source) == {"AK1"} and issuer.issued == 1
    clock.now += issuer.lifetime - 200  # inside the 5-minute margin: renew before expiry
    assert _hammer(source) == {"AK2"} and issuer.issued == 2


def test_environment_with_session_token(tmp_path):
    env = _base_env(tmp_path, AWS_ACCESS_KEY_ID="AKENV", AWS_SECRET_ACCESS_KEY="s", AWS_SESSION_TOKEN="tok")
    credentials = aws_s3_config(env).source()
    assert (credentials.access_key, credentials.session_token) == ("AKENV", "tok")


def test_profiles_from_shared_files_with_aws_profile(tmp_path):
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text("[default]\naws_access_key_id = AKDEF\naws_secret_access_key = d\n"
                                     "[dev]\naws_access_key_id = AKDEV\naws_secret_access_key = s\n"
                                     "aws_session_token = devtok\n")
    (aws / "config").write_text("[profile dev]\nregion = eu-north-1\n[profile cfg]\n"
                                "aws_access_key_id = AKCFG\naws_secret_access_key = c\n")
    dev = aws_s3_config(_base_env(tmp_path, AWS_PROFILE="dev"))
    assert (dev.source().access_key, dev.source().session_token, dev.region) == ("AKDEV", "devtok", "eu-north-1")
    assert aws_s3_config(_base_env(tmp_path)).source().access_key == "AKDEF"
    assert aws_s3_config(_base_env(tmp_path, AWS_PROFILE="cfg")).source().access_key == "AKCFG"


def test_container_credentials_with_authorization_token_file(tmp_path):
    clock = FakeClock()
    issuer = KeyIssuer(clock)
    token = tmp_path / "token"
    token.write_text("secret-token\n")

    def handler(request):
        if request.header("authorization") != "secret-token" or request.path != "/v2/creds":
            return Reply(401)
        return Reply(200, {}, json.dumps(issuer.issue()).encode())

    with ScriptedServer(handler) as server:
        env = _base_env(tmp_path, AWS_CONTAINER_CREDENTIALS_FULL_URI=f"{server.endpoint}/v2/creds",
                        AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=str(token))
        _renewal_is_once_and_on_time(aws_s3_config(env, clock=clock), issuer, clock)


def test_instance_role_through_imdsv2(tmp_path):
    clock = FakeClock()
    issuer = KeyIssuer(clock)
    tokens = []

    def handler(request):
        if request.method == "PUT" and request.path == "/latest/api/token":
            if request.header("x-aws-ec2-metadata-token-ttl-seconds") is None:
                return Reply(400)
            tokens.append(f"imds-token-{len(tokens)}")
            return Reply(200, {}, tokens[-1].encode())
        if request.header("x-aws-ec2-metadata-token") not in tokens:
            return Reply(401)  # IMDSv1 (no token) is refused, as on hardened instances
        if request.path == "/latest/meta-data/iam/security-credentials/":
            return Reply(200, {}, b"pegasus-role")
        if request.path == "/latest/meta-data/iam/security-credentials/pegasus-role":
            return Reply(200, {}, json.dumps(issuer.issue()).encode())
        return Reply(404)

    with ScriptedServer(handler) as server:
        env = {"HOME": str(tmp_path), "AWS_EC2_METADATA_SERVICE_ENDPOINT": server.endpoint}
        _renewal_is_once_and_on_time(aws_s3_config(env, clock=clock), issuer, clock)
        assert len(tokens) == 2  # a fresh session token for each renewal


def test_web_identity_exchanges_the_current_token_at_sts(tmp_path):
    clock = FakeClock()
    issuer = KeyIssuer(clock)
    token_file = tmp_path / "eks-token"
    token_file.write_text("jwt-1")
    seen = []

    def handler(request):
        form = {k: v[0] for k, v in parse_qs(request.body.decode()).items()}
        if form.get("Action") != "AssumeRoleWithWebIdentity" or form.get("RoleArn") != "arn:aws:iam::1:role/r":
            return Reply(400)
        seen.append(form["WebIdentityToken"])
        keys = issuer.issue()
        body = (f"<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                f"<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{keys['AccessKeyId']}</AccessKeyId>"
                f"<SecretAccessKey>{keys['SecretAccessKey']}</SecretAccessKey><SessionToken>{keys['Token']}"
                f"</SessionToken><Expiration>{keys['Expiration']}</Expiration></Credentials>"
                f"</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>")
        return Reply(200, {}, body.encode())

    with ScriptedServer(handler) as server:
        env = _base_env(tmp_path, AWS_WEB_IDENTITY_TOKEN_FILE=str(token_file), AWS_ROLE_ARN="arn:aws:iam::1:role/r",
                        AWS_ENDPOINT_URL_STS=server.endpoint)
        config = aws_s3_config(env, clock=clock)
        token_file.write_text("jwt-2")  # EKS rotates the token; a renewal must send the new one
        _renewal_is_once_and_on_time(config, issuer, clock)
    assert seen == ["jwt-1", "jwt-2"]


def test_a_failed_renewal_keeps_still_valid_keys_then_names_the_link(tmp_path):
    clock = FakeClock()
    issuer = KeyIssuer(clock)
    healthy = [True]

    def handler(request):
        return Reply(200, {}, json.dumps(issuer.issue()).encode()) if healthy[0] else Reply(500)

    with ScriptedServer(handler) as server:
        env = _base_env(tmp_path, AWS_CONTAINER_CREDENTIALS_FULL_URI=f"{server.endpoint}/c")
        source = aws_s3_config(env, clock=clock).source
        healthy[0] = False
        clock.now += issuer.lifetime - 100
        assert source().access_key == "AK1"  # renewal failed, but the keys still work
        clock.now += 200
        with pytest.raises(ConfigError) as info:
            source()
    assert "container credentials" in str(info.value) and "HTTP 500" in str(info.value)


def test_no_credentials_anywhere_names_every_link(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError) as info:
        aws_s3_config({"HOME": str(tmp_path), "AWS_EC2_METADATA_SERVICE_ENDPOINT": closed})
    message = str(info.value)
    for link in ("environment", "web identity", "shared files", "container", f"instance metadata ({closed})"):
        assert link in message
    assert "\n" not in message


def test_a_broken_container_endpoint_is_named(tmp_path):
    with ScriptedServer(lambda r: Reply(403)) as server:
        with pytest.raises(ConfigError) as info:
            aws_s3_config(_base_env(tmp_path, AWS_CONTAINER_CREDENTIALS_FULL_URI=f"{server.endpoint}/x"))
    assert f"container credentials ({server.endpoint}/x): HTTP 403" in str(info.value)


def test_anonymous_only_when_asked(tmp_path):
    assert aws_s3_config(_base_env(tmp_path, AWS_NO_SIGN_REQUEST="true")).source is None


def test_container_credentials_reach_a_real_s3_server(minio, tmp_path):
    """End to end: an s3://BUCKET/KEY download signed with keys from the container endpoint."""
    admin = boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                         aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    admin.create_bucket(Bucket="chain-e2e")
    admin.put_object(Bucket="chain-e2e", Key="k", Body=b"from the chain")
    keys = {"AccessKeyId": minio.access_key, "SecretAccessKey": minio.secret_key,
            "Expiration": _stamp(time.time() + 3600)}
    with ScriptedServer(lambda r: Reply(200, {}, json.dumps(keys).encode())) as server:
        env = _base_env(tmp_path, AWS_CONTAINER_CREDENTIALS_FULL_URI=f"{server.endpoint}/c",
                        AWS_ENDPOINT_URL_S3=minio.endpoint, AWS_REGION="us-east-1",
                        PEGASUS_CLOUDIO_CONFIG="/dev/null")
        with Session(Settings(), env) as session:
            url = parse_url("s3://chain-e2e/k")
            sink = io.BytesIO()
            session.backend(url).get(url, sink)
    assert sink.getvalue() == b"from the chain"

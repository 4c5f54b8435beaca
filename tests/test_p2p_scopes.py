"""Peer sharing follows store credentials (``docs/security.md``) when one transfer names the
same object through two identities: what the node cache got from the store is shared under
the scope of the identity that read it, never under another the store refuses it to.
Real stack on loopback: MinIO with a restricted STS identity, redis-server, two nodes each
with its cache and TLS daemon (tests/test_p2p_engine.py's ``Node``)."""

from __future__ import annotations

import json
import uuid

import boto3

from pegasus_cloudio_testbed.certs import make_tls_files
from transfer import Transfer, parse_url
from test_p2p_engine import Node, redis_server  # noqa: F401 - the fixture, for this module too


def _restricted(minio, bucket: str, prefix: str) -> dict:
    """Temporary keys that may read ``bucket/prefix*`` only."""
    policy = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*"]}]}
    sts = boto3.client("sts", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                       aws_secret_access_key=minio.secret_key, region_name="us-east-1")
    return sts.assume_role(RoleArn="arn:xxx:xxx:xxx:xxxx", RoleSessionName="ro", Policy=json.dumps(policy),
                           DurationSeconds=3600)["Credentials"]


def _env(path, minio, sections: dict) -> dict:
    text = f"[minio]\nendpoint = {minio.endpoint}\n"
    for label, keys in sections.items():
        text += f"[{label}@minio]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    path.write_text(text)
    path.chmod(0o600)
    return {"PEGASUS_CREDENTIALS": str(path), "HOME": str(path.parent), "PEGASUS_CLOUDIO_CONFIG": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true"}


def test_an_object_read_with_one_identity_is_not_shared_under_another_that_may_not_read_it(
        tmp_path, redis_server, minio, bucket):  # noqa: F811 - the fixture imported above
    secret = b"readable by the full identity only"
    boto3.client("s3", endpoint_url=minio.endpoint, aws_access_key_id=minio.access_key,
                 aws_secret_access_key=minio.secret_key, region_name="us-east-1").put_object(
        Bucket=bucket, Key="private/secret.dat", Body=secret)
    got = _restricted(minio, bucket, "public/")
    ro = {"access_key": got["AccessKeyId"], "secret_key": got["SecretAccessKey"],
          "session_token": got["SessionToken"]}
    full = {"access_key": minio.access_key, "secret_key": minio.secret_key}
    tls = make_tls_files(tmp_path / "tls")
    namespace = f"t{uuid.uuid4().hex[:8]}"
    alice, carol = (Node(name, tmp_path, redis_server.url, tls, namespace) for name in ("a", "c"))
    try:
        both = _env(tmp_path / "alice.conf", minio, {"ro": ro, "full": full})
        only_ro = _env(tmp_path / "carol.conf", minio, {"ro": ro})

        def url(label):
            return parse_url(f"s3://{label}@minio/{bucket}/private/secret.dat", site_label="minio")

        # Alice's transfer lists a replica through the restricted identity first (refused by
        # the store), then through the full one (read)
        first = alice.run(both, [Transfer((url("ro"), url("full")), parse_url(f"file://{tmp_path}/a.dat"))])[0]
        assert first.ok and (tmp_path / "a.dat").read_bytes() == secret
        assert not first.history[0].ok  # the store refused the restricted identity

        # Carol holds only the restricted identity: the store refuses her, and so must peers
        theirs = carol.run(only_ro, [Transfer((url("ro"),), parse_url(f"file://{tmp_path}/c.dat"))])[0]
        assert not theirs.ok, "a peer gave the restricted identity an object the store refuses it"
        assert not (tmp_path / "c.dat").exists()
    finally:
        alice.daemon.stop()
        carol.daemon.stop()

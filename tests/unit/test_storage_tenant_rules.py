"""Storage per tenant, the pure parts: which names are substituted, how ``{tenant}`` templates
and ``bucket/prefix`` entries are read, which roots and entries a tenant gets, and the settings
(flag, environment, default root) that carry them."""

from __future__ import annotations

from pathlib import Path

import pytest

from frameserve.config import Settings
from frameserve.errors import InvalidInputError
from frameserve.jobs import SourceError
from frameserve.jobs.settings import JobsSettings
from frameserve.jobs.storage import BucketRule, Storage, tenant_folder


@pytest.mark.parametrize("name", ["alice", "a", "batch-team", "ops@corp.example", "A.b_c-9", "x" * 64])
def test_a_token_name_is_its_own_folder(name: str) -> None:
    assert tenant_folder(name) == name


def test_the_implicit_owner_is_default() -> None:
    assert tenant_folder("") == "default"


@pytest.mark.parametrize("name", ["..", ".", "../bob", "a/b", "-a", ".hidden", "x" * 65, "a b", "a\x00", "é"])
def test_anything_but_a_token_name_is_never_substituted(name: str) -> None:
    with pytest.raises(SourceError, match="cannot name a storage folder"):
        tenant_folder(name)
    with pytest.raises(SourceError, match="cannot name a storage folder"):
        Storage(file_roots=["/data/{tenant}"]).roots_for(name)
    with pytest.raises(SourceError, match="cannot name a storage folder"):
        Storage(s3_allow_buckets=["media/{tenant}/"]).check_source("s3://media/x/clip.mp4", tenant=name)


def test_templates_substitute_each_tenant_and_default_for_the_implicit_owner() -> None:
    st = Storage(file_roots=["/data/{tenant}", "/archive/{tenant}/media"])
    assert st.roots_for("alice") == (Path("/data/alice"), Path("/archive/alice/media"))
    assert st.roots_for("bob") == (Path("/data/bob"), Path("/archive/bob/media"))
    assert st.roots_for("") == (Path("/data/default"), Path("/archive/default/media"))
    assert st.shared() == []


@pytest.mark.parametrize("root", ["/data/x{tenant}", "/data/{tenant}x", "/data/{tenat}", "/data/{tenant"])
def test_a_placeholder_is_a_whole_segment_and_the_only_one(root: str) -> None:
    with pytest.raises(InvalidInputError, match="must be a whole path segment"):
        Storage(file_roots=[root])


def test_a_root_without_tenant_serves_named_tenants_only_when_shared() -> None:
    st = Storage(file_roots=["/data/{tenant}", "/common"])
    assert st.roots_for("") == (Path("/data/default"), Path("/common"))  # one tenant: nothing is shared
    assert st.roots_for("alice") == (Path("/data/alice"),)
    assert st.shared() == ["/common"]
    shared = Storage(file_roots=["/data/{tenant}", "/common"], shared_file_root=True)
    assert shared.roots_for("alice") == (Path("/data/alice"), Path("/common"))


def test_the_default_root_gives_the_implicit_owner_the_whole_folder(tmp_path: Path) -> None:
    st = Storage(file_roots=[tmp_path / "{tenant}"], implicit_file_roots=[tmp_path])
    assert st.roots_for("") == (tmp_path,)
    assert st.roots_for("alice") == (tmp_path / "alice",)


@pytest.mark.parametrize(
    ("entry", "rule"),
    [
        ("media", BucketRule("media")),
        ("media/", BucketRule("media")),
        ("media/{tenant}/", BucketRule("media", ("{tenant}",))),
        ("media/in/{tenant}", BucketRule("media", ("in", "{tenant}"))),
    ],
)
def test_bucket_entries_are_a_bucket_and_a_prefix(entry: str, rule: BucketRule) -> None:
    assert BucketRule.parse(entry) == rule


@pytest.mark.parametrize(
    "entry", ["{tenant}/x", "/media", "media//x", "media/../x", "media/./x", "media/x{tenant}", "u@media"]
)
def test_bad_bucket_entries_are_refused(entry: str) -> None:
    with pytest.raises(InvalidInputError, match="--s3-allow-bucket"):
        Storage(s3_allow_buckets=[entry])


def test_s3_keys_lie_under_the_tenants_prefix_in_whole_segments() -> None:
    st = Storage(s3_allow_buckets=["media/{tenant}/", "public/in/{tenant}"])
    st.check_source("s3://media/alice/clip.mp4", tenant="alice")
    st.check_source("s3://public/in/alice/a/b.mp4", tenant="alice")
    st.check_target("s3://media/alice/", tenant="alice")  # the prefix itself is a target (<target>/<name>)
    st.check_target("s3://media/alice/out/1", tenant="alice")
    refused = [
        ("source", "s3://media/bob/clip.mp4"),  # another tenant's prefix
        ("source", "s3://media/alicex/clip.mp4"),  # a string prefix is not a segment prefix
        ("source", "s3://media/alice"),  # the prefix is not an object
        ("source", "s3://media/alice/../bob/clip.mp4"),
        ("source", "s3://media/alice/./clip.mp4"),
        ("source", "s3://media/alice//clip.mp4"),
        ("source", "s3://other/alice/clip.mp4"),
        ("target", "s3://media/bob/out"),
        ("target", "s3://media/alice/../bob"),
        ("target", "s3://media/"),
    ]
    for what, uri in refused:
        with pytest.raises(SourceError) as info:
            (st.check_source if what == "source" else st.check_target)(uri, tenant="alice")
        message = str(info.value)
        assert "bob" not in message.replace(uri, ""), message  # only the URI given, never another tenant's prefix
    with pytest.raises(
        SourceError,
        match=r"not under tenant 'alice'.s allowed buckets and prefixes \(s3://media/alice/, "
        r"s3://public/in/alice/\)",
    ):
        st.check_source("s3://media/bob/clip.mp4", tenant="alice")


def test_a_bare_bucket_is_the_implicit_owners_and_shared_only_on_purpose() -> None:
    st = Storage(s3_allow_buckets=["media"])
    st.check_source("s3://media/any/clip.mp4", tenant="")
    with pytest.raises(
        SourceError, match="no bucket is allowed to tenant 'alice'.*shared between tenants only with --shared-file-root"
    ):
        st.check_source("s3://media/any/clip.mp4", tenant="alice")
    Storage(s3_allow_buckets=["media"], shared_file_root=True).check_source("s3://media/any/clip.mp4", tenant="alice")


def test_settings_default_root_per_tenant_and_the_flag_round_trip(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, model_repository=tmp_path / "models", threads=1)
    one = JobsSettings.from_env(settings, {})
    assert one.file_roots == (tmp_path / "storage",) and one.implicit_file_root is None and not one.shared_file_root
    many = JobsSettings.from_env(settings, {}, tenants=True)
    assert many.file_roots == (tmp_path / "storage" / "{tenant}",) and many.implicit_file_root == tmp_path / "storage"
    assert many.storage().roots_for("alice") == (tmp_path / "storage" / "alice",)
    assert many.storage().roots_for("") == (tmp_path / "storage",)
    assert many.folders() == [tmp_path / "storage", tmp_path / "storage"]
    assert JobsSettings.from_env(settings, many.to_env(), tenants=True) == many  # the default stays the default
    given = JobsSettings.from_env(
        settings,
        {"FRAMESERVE_SHARED_FILE_ROOT": "1"},
        file_roots=["/data/{tenant}", "/common"],
        s3_allow_buckets=["media/{tenant}/"],
        tenants=True,
    )
    assert given.shared_file_root and given.implicit_file_root is None
    env = given.to_env()
    assert env["FRAMESERVE_SHARED_FILE_ROOT"] == "1" and env["FRAMESERVE_FILE_ROOTS"] == "/data/{tenant}:/common"
    assert JobsSettings.from_env(settings, env, tenants=True) == given
    assert JobsSettings.from_env(settings, env, shared_file_root=False, tenants=True).storage().roots_for("alice") == (
        Path("/data/alice"),
    )

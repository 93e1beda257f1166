"""The export downloads on the dashboard: the checkpoint's .tar.gz and the diff's patch, for an
owner, a viewer and an outsider; streamed, and under ASGI one chunk at a time."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client

from agents import checkpoints, export
from tests.helpers import client_for, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(owner):
    run = make_run(created_by=owner)
    (run.workspace_path / "a.txt").write_text("one\n")
    first = checkpoints.create(run.pk, kind="manual", actor="test")
    (run.workspace_path / "a.txt").write_text("two\n")
    (run.workspace_path / "b.bin").write_bytes(b"\0\1\2")
    second = checkpoints.create(run.pk, kind="manual", actor="test")
    run.first, run.second = first, second
    return run


def tar_url(run, cp) -> str:
    return f"/runs/{run.pk}/checkpoints/{cp.number}/export.tar.gz"


def patch_url(run, a, b="live") -> str:
    return f"/runs/{run.pk}/diff.patch?a={a}&b={b}"


def body(response) -> bytes:
    assert response.streaming
    return b"".join(response.streaming_content)


def test_the_owner_and_a_viewer_download_the_tar(run, owner, viewer):
    for user in (owner, viewer):
        response = client_for(user).get(tar_url(run, run.second))
        assert response.status_code == 200
        assert response["Content-Type"] == "application/gzip"
        name = export.tar_name(run.second)
        assert response["Content-Disposition"] == f'attachment; filename="{name}.tar.gz"'
        data = body(response)
        assert data == b"".join(export.tar_chunks(run.second))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
        assert names == [name, f"{name}/a.txt", f"{name}/b.bin"]


def test_the_owner_and_a_viewer_download_the_patch(run, owner, viewer):
    a, b = run.first, run.second
    for user in (owner, viewer):
        response = client_for(user).get(patch_url(run, a.number, b.number))
        assert response.status_code == 200
        assert response["Content-Type"] == "text/x-diff; charset=utf-8"
        assert response["Content-Disposition"].endswith(f'{export.patch_name(a, b)}.patch"')
        assert body(response) == export.patch(a, b)
    (run.workspace_path / "c.txt").write_text("live\n")
    data = body(client_for(owner).get(patch_url(run, a.number, "live")))
    assert data == export.patch(a, None) and b"+live" in data
    # b defaults to live, as on the diff page.
    assert body(client_for(owner).get(f"/runs/{run.pk}/diff.patch?a={a.number}")) == data


def test_outsiders_get_404_and_anonymous_visitors_the_login(run, outsider):
    for url in (tar_url(run, run.first), patch_url(run, run.first.number)):
        assert client_for(outsider).get(url).status_code == 404
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_posts_bad_and_foreign_ids(run, owner):
    c = client_for(owner)
    assert c.post(tar_url(run, run.first)).status_code == 405
    assert c.post(patch_url(run, run.first.number)).status_code == 405
    other = make_run(created_by=owner)  # numbers are per run: one this run does not have
    for _ in range(run.checkpoints.count() + 1):
        foreign = checkpoints.create(other.pk, kind="manual", actor="test")
    assert c.get(tar_url(run, foreign)).status_code == 404
    assert c.get(f"/runs/{run.pk}/checkpoints/999999/export.tar.gz").status_code == 404
    for query in (
        "",
        "?a=x",
        f"?a={run.first.number}&b=zz",
        f"?a={foreign.number}",
        "?a=-1",
        "?a=99999999",
    ):
        assert c.get(f"/runs/{run.pk}/diff.patch{query}").status_code == 404, query
    assert c.get(patch_url(run, run.first.number, foreign.number)).status_code == 404


def test_a_missing_blob_is_a_clear_409_not_a_500(run, owner):
    from agents import workspaces
    from agents.blobstore import BlobStore

    (run.workspace_path / "own.bin").write_bytes(os.urandom(16))  # the store is shared
    run.second = checkpoints.create(run.pk, kind="manual", actor="test")
    digest = workspaces.store().files(run.second.tree)["own.bin"].hash
    BlobStore().path(digest).unlink()
    response = client_for(owner).get(tar_url(run, run.second))
    assert response.status_code == 409 and b"not in the store" in response.content
    response = client_for(owner).get(patch_url(run, run.first.number, run.second.number))
    assert response.status_code == 409


def test_links_on_the_run_page_and_the_diff_page(run, owner):
    c = client_for(owner)
    html = c.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="{tar_url(run, run.first)}" download>download .tar.gz</a>' in html
    html = c.get(
        f"/runs/{run.pk}/diff/?a={run.first.number}&b={run.second.number}"
    ).content.decode()
    assert (
        f'href="/runs/{run.pk}/diff.patch?a={run.first.number}&amp;b={run.second.number}"' in html
    )
    html = c.get(f"/runs/{run.pk}/diff/?a={run.first.number}&b=live").content.decode()
    assert f'href="/runs/{run.pk}/diff.patch?a={run.first.number}&amp;b=live" download>' in html


def test_under_asgi_the_download_is_an_async_stream(run, owner):
    client = AsyncClient()
    client.force_login(owner)

    async def fetch(url):
        response = await client.get(url)
        assert response.status_code == 200
        assert response.is_async  # Django does not collect it into a list first
        return [chunk async for chunk in response.streaming_content]

    chunks = async_to_sync(fetch)(tar_url(run, run.second))
    assert b"".join(chunks) == b"".join(export.tar_chunks(run.second))
    chunks = async_to_sync(fetch)(patch_url(run, run.first.number, run.second.number))
    assert b"".join(chunks) == export.patch(run.first, run.second)


def test_an_artifact_download_streams_under_asgi_too(owner):
    """A FileResponse under ASGI would be read whole into memory: it is served chunk by chunk."""
    from asgiref.sync import async_to_sync

    from agents import streaming
    from agents.blobstore import BlobStore
    from agents.models import Artifact

    run = make_run(created_by=owner)
    data = bytes(range(256)) * 1024  # 256 KiB: several chunks
    artifact = Artifact.objects.create(
        run=run, name="big.bin", kind="file", blob_hash=BlobStore().put(data), size=len(data)
    )
    client = AsyncClient()
    client.force_login(owner)

    async def fetch():
        response = await client.get(f"/runs/{run.pk}/artifacts/{artifact.pk}/download")
        assert response.status_code == 200 and response.is_async
        assert response["Content-Length"] == str(len(data))
        return [chunk async for chunk in response.streaming_content]

    chunks = async_to_sync(fetch)()
    assert b"".join(chunks) == data
    assert len(chunks) == len(data) // streaming.CHUNK

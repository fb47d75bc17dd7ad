"""The store suite, run against both backends through the service (1.4.1 data semantics)."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata

import pytest

from gateway.context import errors
from gateway.context.model import ArtifactAddress, ArtifactRef, AtomicMemoryInput
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from tests.context.conftest import Backend, make_service

pytestmark = pytest.mark.asyncio

TOPIC = {"title": "Billing DB", "summary": "Which DB billing uses", "detail": "Billing uses PostgreSQL 17."}
EXPERIENCE = {
    "situation": "Deploy failed",
    "action": "Rolled back",
    "outcome": "Recovered",
    "lesson": "Check migrations first",
}


async def _scope(svc: ContextService, key: str = "k1", **kw: object) -> str:
    scope, created = await svc.create_scope(title="t", summary="s", idempotency_key=key, principal="user:a", **kw)
    assert created
    return scope.scope_id


async def _mem(svc: ContextService, scope_id: str, text: str, kind: str = "fact") -> str:
    return (await svc.create_artifact(scope_id, "atomic-memory", {"kind": kind, "text": text})).artifact_id


async def test_scope_ids_idempotency_and_listing(service: ContextService) -> None:
    scope, created = await service.create_scope(title="a", summary="s", idempotency_key="dup", principal="user:a")
    assert created and re.fullmatch(r"scp_[0-9a-hjkmnp-tv-z]{26}", scope.scope_id)
    assert scope.created_by == "user:a" and scope.version == 1
    again, created_again = await service.create_scope(title="a", summary="s", idempotency_key="dup", principal="user:a")
    assert again == scope and not created_again
    with pytest.raises(errors.ScopeIdempotencyConflict):
        await service.create_scope(title="b", summary="s", idempotency_key="dup", principal="user:a")
    other, created_other = await service.create_scope(title="a", summary="s", idempotency_key="dup", principal="user:b")
    assert created_other and other.scope_id != scope.scope_id  # keys are per principal
    for i in range(5):
        await service.create_scope(title="x", summary="s", idempotency_key=f"k{i}", principal=None)
    seen: list[str] = []
    cursor = None
    while True:
        page = await service.list_scopes(limit=3, cursor=cursor)
        seen += [s.scope_id for s in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == 8
    assert "default" in seen
    assert (await service.get_scope("default")).title == "Default"
    with pytest.raises(errors.ScopeNotFound):
        await service.get_scope("scp_doesnotexist")
    with pytest.raises(errors.InvalidCursor):
        await service.list_scopes(cursor="garbage")


async def test_artifact_revisions_etags_and_exact_reads(service: ContextService) -> None:
    sid = await _scope(service)
    created = await service.create_artifact(
        sid, "atomic-memory", {"kind": "decision", "text": "We use PostgreSQL 16 for the billing service database."}
    )
    assert re.fullmatch(r"art_[0-9a-f]{32}", created.artifact_id) and created.revision == 1
    assert created.etag == '"revision:1"'
    # the same digest 1.4.1 reported for the same content
    assert created.content_digest == "sha256:fee79b642ad5ee71ac743261f7816be67da6094269d31821aa6de06bf90d2d4b"
    aid = created.artifact_id
    with pytest.raises(errors.PreconditionRequired):
        await service.replace_artifact(sid, "atomic-memory", aid, {"kind": "decision", "text": "x"}, if_match=None)
    r2 = await service.replace_artifact(
        sid,
        "atomic-memory",
        aid,
        {"kind": "decision", "text": "We use PostgreSQL 17 for the billing service database."},
        if_match='"revision:1"',
    )
    assert r2.revision == 2 and r2.previous == ArtifactRef("atomic-memory", aid, 1)
    assert r2.content_digest == "sha256:6648aa5677c1814c7ae553d1a33248677aaa929a5af26e7b319758f175d6b44a"
    for stale in ('"revision:1"', "revision:2", 'W/"revision:2"', "*", "whatever"):
        with pytest.raises(errors.RevisionConflict) as exc:
            await service.replace_artifact(
                sid, "atomic-memory", aid, {"kind": "decision", "text": "stale"}, if_match=stale
            )
        assert exc.value.details == {"provided_etag": stale, "current_etag": '"revision:2"'}
    head = await service.get_artifact(sid, "atomic-memory", aid)
    assert head.revision == 2 and head.content["text"].endswith("17 for the billing service database.")
    old = await service.get_artifact_revision(sid, "atomic-memory", aid, 1)
    assert old.content["text"] == "We use PostgreSQL 16 for the billing service database."
    assert [r.revision for r in (await service.list_artifact_revisions(sid, "atomic-memory", aid)).items] == [2, 1]
    page = await service.list_artifact_revisions(sid, "atomic-memory", aid, limit=1)
    assert [r.revision for r in page.items] == [2]
    page = await service.list_artifact_revisions(sid, "atomic-memory", aid, limit=1, cursor=page.next_cursor)
    assert [r.revision for r in page.items] == [1] and page.next_cursor is None
    with pytest.raises(errors.ArtifactNotFound):
        await service.get_artifact_revision(sid, "atomic-memory", aid, 99)
    with pytest.raises(errors.ArtifactNotFound):
        await service.get_artifact(sid, "atomic-memory", "art_doesnotexist")
    with pytest.raises(errors.ScopeNotFound):
        await service.create_artifact("scp_nope", "atomic-memory", {"kind": "fact", "text": "x"})
    wire = head.to_wire()
    assert wire["artifacts"] == [{"family": "atomic-memory", "artifact_id": aid, "revision": 1}]
    canonical = json.dumps(wire["content"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert wire["content_digest"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


async def test_families_and_profile(service: ContextService) -> None:
    sid = await _scope(service)
    topic = await service.create_artifact(sid, "topic-memory", TOPIC)
    assert dict(topic.content) == TOPIC
    assert topic.content_digest == "sha256:7e343d04034b9d749860d390ff65fae9fb6d8f1f716cb1346a2acecf3698eab8"
    exp = await service.create_artifact(sid, "experience", EXPERIENCE)
    assert dict(exp.content) == {**EXPERIENCE, "failure": None}
    assert exp.content_digest == "sha256:551f812505dd0dde970277da215fcc6dd38ad9f1f9e12245d94631c7da1b1f3c"
    prof = await service.create_artifact(sid, "profile", {"content": "Prefers concise answers."})
    assert prof.artifact_id == "profile" and prof.content["content"] == "Prefers concise answers.\n"
    with pytest.raises(errors.ArtifactAlreadyExists):
        await service.create_artifact(sid, "profile", {"content": "again"})
    with pytest.raises(errors.InvalidRequest):
        await service.create_artifact(sid, "topic-memory", {**TOPIC, "title": "   "})
    with pytest.raises(errors.InvalidRequest):
        await service.create_artifact(sid, "nope", {})
    with pytest.raises(errors.ArtifactSearchNotSupported):
        await service.search(sid, "profile", "concise")
    heads = await service.list_artifacts(sid, "topic-memory")
    assert [h.artifact_id for h in heads.items] == [topic.artifact_id]


async def test_atomic_text_normalisation(service: ContextService) -> None:
    sid = await _scope(service)
    decomposed = "  Cafe\u0301 au lait \n"
    rev = await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": decomposed})
    assert rev.content["text"] == unicodedata.normalize("NFC", "Cafe\u0301 au lait") == "Café au lait"
    ok = "é" * 4096  # 8192 bytes exactly
    await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": ok})
    for bad in ("", "   ", "é" * 4096 + "x", "\ud800"):
        with pytest.raises(errors.InvalidRequest):
            await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": bad})
    with pytest.raises(errors.InvalidRequest):
        await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "x", "extra": 1})


async def test_atomic_lifecycle_merge_retire(service: ContextService) -> None:
    sid = await _scope(service)
    a = await _mem(service, sid, "The staging cluster runs in region eu-west-1.")
    b = await _mem(service, sid, "Migrate the auth service to the new token format by March.", "next_step")
    c = await _mem(service, sid, "Never deploy to production on Fridays after 15:00 UTC.", "constraint")
    d = await _mem(service, sid, "CI runs on GitHub Actions.")
    st = await service.get_atomic_state(sid, c)
    assert st.to_wire() == {
        "artifact": {"family": "atomic-memory", "artifact_id": c, "revision": 1},
        "state": "active",
        "state_version": 0,
        "merged_into_id": None,
    }
    assert st.etag == '"revision:1:state:0"'
    forget = await service.change_lifecycle(sid, AtomicMemoryInput(st.artifact, 0), "forgotten")
    assert forget.changed and forget.records[0].state.value == "forgotten" and forget.records[0].state_version == 1
    with pytest.raises(errors.AtomicMemoryChanged):
        await service.change_lifecycle(sid, AtomicMemoryInput(st.artifact, 0), "forgotten")
    same = await service.change_lifecycle(sid, AtomicMemoryInput(st.artifact, 1), "forgotten")
    assert not same.changed and same.records[0].state_version == 1
    with pytest.raises(errors.InvalidRequest):
        await service.change_lifecycle(sid, AtomicMemoryInput(st.artifact, 1), "active")
    # the forgotten memory stays readable, by head and by exact revision, and listed by the generic list
    assert (await service.get_artifact(sid, "atomic-memory", c)).revision == 1
    assert (await service.get_artifact_revision(sid, "atomic-memory", c, 1)).content["kind"] == "constraint"
    assert c in [h.artifact_id for h in (await service.list_artifacts(sid, "atomic-memory")).items]
    assert c not in [r.artifact.artifact_id for r in (await service.list_atomic_memories(sid)).items]
    # merge
    sa, sb = await service.get_atomic_state(sid, a), await service.get_atomic_state(sid, b)
    merged = await service.merge_atomic_memories(
        sid,
        [AtomicMemoryInput(sa.artifact, 0), AtomicMemoryInput(sb.artifact, 0)],
        {"kind": "fact", "text": "Staging is in eu-west-1; auth token migration due March."},
    )
    ids = [r.artifact.artifact_id for r in merged.records]
    assert ids == sorted(ids) and len(ids) == 3
    new_id = next(i for i in ids if i not in (a, b))
    by_id = {r.artifact.artifact_id: r for r in merged.records}
    assert by_id[a].state.value == by_id[b].state.value == "merged"
    assert by_id[a].merged_into_id == by_id[b].merged_into_id == new_id and by_id[a].state_version == 1
    assert by_id[new_id].state.value == "active" and by_id[new_id].state_version == 0
    with pytest.raises(errors.AtomicMemoryChanged):  # stale input
        await service.merge_atomic_memories(
            sid,
            [AtomicMemoryInput(sa.artifact, 0), AtomicMemoryInput(by_id[new_id].artifact, 0)],
            {"kind": "fact", "text": "x"},
        )
    # retire (wiregate lifecycle extension)
    sd = await service.get_atomic_state(sid, d)
    retired = await service.change_lifecycle(sid, AtomicMemoryInput(sd.artifact, 0), "retired")
    assert retired.records[0].state.value == "retired"
    # merged/retired inputs cannot be forgotten (1.4.1: 409 invalid_memory_state)
    with pytest.raises(errors.InvalidMemoryState):
        await service.change_lifecycle(sid, AtomicMemoryInput(sa.artifact, 1), "forgotten")
    everything = await service.list_atomic_memories(sid, states=["active", "forgotten", "merged", "retired"])
    assert {r.state.value for r in everything.items} == {"active", "forgotten", "merged", "retired"}
    assert [r.artifact.artifact_id for r in (await service.list_atomic_memories(sid)).items] == [new_id]
    # exact revisions of every state remain readable and never follow the head
    for aid in (a, b, c, d):
        assert (await service.get_artifact_revision(sid, "atomic-memory", aid, 1)).revision == 1
    # a replace of a forgotten memory is allowed and keeps it out of search
    r2 = await service.replace_artifact(
        sid, "atomic-memory", c, {"kind": "constraint", "text": "Deploy Fridays"}, if_match='"revision:1"'
    )
    assert r2.revision == 2
    assert (await service.search(sid, "atomic-memory", "Deploy Fridays")).hits == ()


async def test_dependencies_eligible(service: ContextService) -> None:
    sid = await _scope(service)
    a = await _mem(service, sid, "alpha memory one")
    b = await _mem(service, sid, "beta memory two")
    t = await service.create_artifact(sid, "topic-memory", TOPIC)
    deps = [ArtifactAddress(sid, ArtifactRef("atomic-memory", a, 1)), ArtifactAddress(sid, t.ref)]
    assert await service.dependencies_eligible(deps) is True
    assert await service.dependencies_eligible([d.to_wire() for d in deps]) is True
    assert await service.dependencies_eligible([{"scope_id": sid}]) == "dependency_malformed"
    await service.replace_artifact(sid, "topic-memory", t.artifact_id, TOPIC, if_match='"revision:1"')
    assert await service.dependencies_eligible(deps) == "dependency_revised"
    sb = await service.get_atomic_state(sid, b)
    await service.change_lifecycle(sid, AtomicMemoryInput(sb.artifact, 0), "forgotten")
    assert await service.dependencies_eligible([ArtifactAddress(sid, sb.artifact)]) == "dependency_forgotten"
    missing = ArtifactAddress(sid, ArtifactRef("atomic-memory", "art_" + "0" * 32, 1))
    assert await service.dependencies_eligible([missing]) == "dependency_missing"
    # the first ineligible dependency in order answers, whatever follows it
    live = ArtifactAddress(sid, ArtifactRef("atomic-memory", a, 1))
    gone = ArtifactAddress(sid, sb.artifact)
    malformed = {"scope_id": sid}
    assert await service.dependencies_eligible([live, missing, malformed]) == "dependency_missing"
    assert await service.dependencies_eligible([live, malformed, missing]) == "dependency_malformed"
    assert await service.dependencies_eligible([live, live, gone, missing]) == "dependency_forgotten"
    other = await _scope(service, "k2")
    o = await _mem(service, other, "gamma memory three")
    in_other = ArtifactAddress(other, ArtifactRef("atomic-memory", o, 1))
    assert await service.dependencies_eligible([live, in_other]) is True
    assert await service.dependencies_eligible([live, ArtifactAddress(other, ArtifactRef("atomic-memory", a, 1))]) == (
        "dependency_missing"  # the same id in another scope is another memory
    )


async def test_two_stores_share_one_database(backend: Backend) -> None:
    s1, s2 = await backend.store(), await backend.store()
    svc1, svc2 = make_service(s1), make_service(s2)
    await svc1.start()
    await svc2.start()  # the default scope is ensured idempotently
    sid = (await svc1.create_scope(title="t", summary="s", idempotency_key="x", principal=None))[0].scope_id
    assert (await svc2.get_scope(sid)).scope_id == sid


async def test_states_are_read_at_once_in_order(service: ContextService, store: ContextStore) -> None:
    sid = await _scope(service)
    a = await _mem(service, sid, "alpha memory one")
    b = await _mem(service, sid, "beta memory two")
    sb = await service.get_atomic_state(sid, b)
    await service.change_lifecycle(sid, AtomicMemoryInput(sb.artifact, 0), "forgotten")
    missing = "art_" + "0" * 32
    # more ids than one IN list holds, repeats and unknown ids included
    ids = [a, missing, b, a] + [f"art_{i:032x}" for i in range(1, 1200)]
    found = await store.get_states(sid, ids)
    assert set(found) == {a, b}
    assert found[a].state.value == "active" and found[b].state.value == "forgotten"
    assert found[b].state_version == 1 and found[a].artifact.revision == 1
    assert await store.get_states(sid, []) == {}
    assert await store.get_states("scp_other", [a]) == {}  # scoped
    states = await service.get_atomic_states(sid, [b, a, b])
    assert [s.artifact.artifact_id for s in states] == [b, a, b]
    with pytest.raises(errors.ArtifactNotFound):
        await service.get_atomic_states(sid, [a, missing])


async def test_lifecycle_merge_and_edit_errors_are_1_4_1s(service: ContextService) -> None:
    """Each refusal with 1.4.1's status and code, on both backends; checked in 1.4.1's order."""
    sid = await _scope(service)
    m = [await _mem(service, sid, f"memory {i}") for i in range(6)]
    t = [AtomicMemoryInput((await service.get_atomic_state(sid, a)).artifact, 0) for a in m]
    topic = await service.create_artifact(sid, "topic-memory", TOPIC)
    missing = AtomicMemoryInput(ArtifactRef("atomic-memory", "art_missing", 1), 0)

    async def refused(call: object) -> tuple[int, str, str]:
        with pytest.raises(errors.ContextError) as caught:
            await call  # type: ignore[misc]
        return caught.value.status, caught.value.code, caught.value.message

    def merge(inputs: list[AtomicMemoryInput]) -> object:
        return service.merge_atomic_memories(sid, inputs, {"kind": "fact", "text": "merged"})

    relation = (409, "invalid_memory_relation", "merge needs at least two distinct inputs and a new result identity")
    assert await refused(merge([t[0], t[0]])) == relation
    assert (await refused(merge([t[0], missing])))[:2] == (404, "not_found")
    assert (await refused(merge([missing, missing])))[:2] == (409, "invalid_memory_relation")  # distinct first
    assert (await refused(merge([t[0], AtomicMemoryInput(topic.ref, 0)])))[:2] == (422, "invalid_request")
    await service.change_lifecycle(sid, t[1], "forgotten")
    changed = (409, "atomic_memory_changed", "merge inputs changed before preparation")
    assert await refused(merge([t[2], AtomicMemoryInput(t[1].artifact, 1)])) == changed  # forgotten, as seen
    assert await refused(merge([t[2], t[1]])) == changed  # stale
    await service.merge_atomic_memories(sid, [t[2], t[3]], {"kind": "fact", "text": "merged"})
    assert await refused(merge([AtomicMemoryInput(t[2].artifact, 1), t[4]])) == changed  # merged, as seen

    def forget(target: AtomicMemoryInput) -> object:
        return service.change_lifecycle(sid, target, "forgotten")

    not_forgettable = (409, "invalid_memory_state", "only active or deprecated Artifacts can be deprecated")
    assert await refused(forget(AtomicMemoryInput(t[2].artifact, 1))) == not_forgettable
    assert (await refused(forget(t[2])))[:2] == (409, "atomic_memory_changed")  # the version is checked first
    stale = AtomicMemoryInput(ArtifactRef("atomic-memory", m[4], 2), 0)
    assert await refused(forget(stale)) == (409, "revision_conflict", "The Memory Revision is stale.")
    assert (await refused(forget(missing)))[:2] == (404, "not_found")
    wrong = await refused(forget(AtomicMemoryInput(topic.ref, 0)))
    assert wrong[:2] == (422, "invalid_request")
    retire = await service.change_lifecycle(sid, t[5], "retired")  # wiregate's extension
    assert await refused(forget(AtomicMemoryInput(t[5].artifact, 1))) == not_forgettable
    assert retire.records[0].state.value == "retired"

    # edits: a merged or retired memory is frozen (after the If-Match check); a forgotten one is edited
    def edit(aid: str, etag: str) -> object:
        return service.replace_artifact(sid, "atomic-memory", aid, {"kind": "fact", "text": "x"}, if_match=etag)

    frozen = (409, "invalid_memory_state", "merged and retired Artifacts cannot be edited")
    for aid in (m[2], m[5]):
        assert (await refused(edit(aid, '"revision:7"')))[:2] == (412, "revision_conflict")
        assert await refused(edit(aid, '"revision:1"')) == frozen
    edited = await edit(m[1], '"revision:1"')  # type: ignore[misc]
    state = await service.get_atomic_state(sid, m[1])
    assert edited.revision == 2 and (state.state.value, state.state_version) == ("forgotten", 1)
    # the generic listing shows neither merged nor retired heads (forgotten ones it shows)
    listed = {h.artifact_id for h in (await service.list_artifacts(sid, "atomic-memory")).items}
    merged_into = (await service.get_atomic_state(sid, m[2])).merged_into_id
    assert listed == {m[0], m[1], m[4], merged_into}
    for states in ([], ["active", "active"]):
        with pytest.raises(errors.InvalidRequest):
            await service.list_atomic_memories(sid, states=states)

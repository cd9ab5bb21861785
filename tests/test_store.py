"""The on-disk layout's one write idiom: ``store.replace_file`` (the clock file, the heartbeat, the
planner's samples, the restore journal and the replay requests all go through it)."""

from __future__ import annotations

import os
import threading

from pipeline import store


def test_replace_file_makes_its_folder_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "a" / "b" / "facts.json"
    store.replace_file(target, '{"n": 1}')
    store.replace_file(target, '{"n": 2}')
    assert target.read_text() == '{"n": 2}'
    assert sorted(p.name for p in target.parent.iterdir()) == ["facts.json"]


def test_a_reader_sees_the_old_file_or_the_new_one_never_half(tmp_path):
    target = tmp_path / "clock.json"
    versions = [str(n) * 200_000 for n in range(10)]  # big enough that a plain write is seen half done
    store.replace_file(target, versions[0])
    seen, done = set(), threading.Event()

    def read():
        while not done.is_set():
            seen.add(target.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(20):
            for text in versions:
                store.replace_file(target, text)
    finally:
        done.set()
        reader.join()
    assert seen <= set(versions)


def test_the_temporary_name_is_the_writing_process_own(tmp_path, monkeypatch):
    target = tmp_path / "heartbeat.json"
    names = []
    real_replace = os.replace
    monkeypatch.setattr(store.os, "replace", lambda src, dst: (names.append(os.path.basename(src)),
                                                               real_replace(src, dst)))
    store.replace_file(target, "{}")
    assert names == [f".heartbeat.json.{os.getpid()}.tmp"]

"""Table transforms: windows, rate scaling, time compression, tenant tagging and merging."""

from __future__ import annotations

import numpy as np
import pytest

from commitenv.workload import (
    RequestTable,
    WorkloadError,
    builtin_lengths,
    compress_time,
    make_table,
    merge,
    scale_rate,
    synthesize,
    tag_tenant,
    time_window,
)


def with_prefixes(arrival, prompts, prefixes, name="p", ids=None) -> RequestTable:
    base = make_table(arrival, prompts, [1] * len(arrival), request_id=ids, source=name)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in prefixes])]).astype(np.int64)
    hashes = np.array([h for p in prefixes for h in p], dtype=np.int64)
    return RequestTable(base.arrival_s, base.prompt_tokens, base.output_tokens, base.tenant, base.request_id,
                        ("default",), offsets, hashes, name)


def test_time_window_selects_and_rebases():
    t = with_prefixes([0.0, 10.0, 20.0, 30.0], [1, 2, 3, 4], [[1], [2, 3], [], [4]])
    w = time_window(t, 10.0, 30.0)
    assert w.prompt_tokens.tolist() == [2, 3] and w.arrival_s.tolist() == [0.0, 10.0]
    assert w.prefix_of(0).tolist() == [2, 3] and w.prefix_of(1).tolist() == []
    assert w.request_id.tolist() == [1, 2]
    assert time_window(t, 10.0, 30.0, rebase=False).arrival_s.tolist() == [10.0, 20.0]
    assert len(time_window(t, 40.0, 50.0)) == 0
    with pytest.raises(WorkloadError, match="before start_s"):
        time_window(t, 5.0, 1.0)
    assert t.arrival_s.tolist() == [0.0, 10.0, 20.0, 30.0]  # input untouched


@pytest.fixture(scope="module")
def day():
    counts = [20_000, 5000, 40_000, 10_000]
    return synthesize(counts, lengths=builtin_lengths("azure_conv"), seed=0), counts


def test_scale_rate_thinning(day):
    t, counts = day
    half = scale_rate(t, 0.5, seed=1)
    assert len(half) == round(0.5 * len(t))
    assert np.isin(half.request_id, t.request_id).all() and len(np.unique(half.request_id)) == len(half)
    assert np.all(np.diff(half.arrival_s) >= 0)
    h = np.bincount((half.arrival_s // 3600).astype(int), minlength=4)
    np.testing.assert_allclose(h / np.array(counts), 0.5, atol=0.03)
    assert np.array_equal(scale_rate(t, 0.5, seed=1).request_id, half.request_id)
    assert not np.array_equal(scale_rate(t, 0.5, seed=2).request_id, half.request_id)


def test_scale_rate_superposition(day):
    t, counts = day
    up = scale_rate(t, 2.5, seed=3)
    assert len(up) == len(t) * 2 + round(0.5 * len(t))
    assert len(np.unique(up.request_id)) == len(up) and np.all(np.diff(up.arrival_s) >= 0)
    assert up.arrival_s.min() >= t.arrival_s[0] and up.arrival_s.max() <= t.arrival_s[-1]
    h = np.bincount((up.arrival_s // 3600).astype(int), minlength=4)
    np.testing.assert_allclose(h / np.array(counts), 2.5, rtol=0.02)
    # every original request is still there, unchanged
    orig = np.isin(up.request_id, t.request_id)
    assert orig.sum() == len(t)
    assert np.array_equal(up.arrival_s[orig], t.arrival_s) and np.array_equal(up.prompt_tokens[orig], t.prompt_tokens)
    with pytest.raises(WorkloadError, match="factor"):
        scale_rate(t, 0.0, seed=0)


def test_scale_rate_keeps_prefixes():
    t = with_prefixes([0.0, 100.0], [5, 6], [[7, 8], [9]])
    up = scale_rate(t, 2.0, seed=0, jitter_s=10.0)
    by_prompt = {int(up.prompt_tokens[i]): up.prefix_of(i).tolist() for i in range(len(up))}
    assert len(up) == 4 and by_prompt == {5: [7, 8], 6: [9]}


def test_compress_time(day):
    t, _ = day
    c = compress_time(t, 4.0)
    np.testing.assert_allclose(c.arrival_s * 4.0, t.arrival_s)
    assert c.duration_s < 3600 and np.array_equal(c.prompt_tokens, t.prompt_tokens)
    with pytest.raises(WorkloadError):
        compress_time(t, -1)


def test_tag_and_merge():
    a = tag_tenant(with_prefixes([0.0, 5.0, 9.0], [1, 2, 3], [[1], [], [2, 2]], name="a"), "code")
    b = tag_tenant(make_table([1.0, 5.0], [10, 20], [4, 4], source="b"), "chat")
    c = make_table([2.0], [100], [1], source="c", tenant_names=("code",))
    m = merge(a, b, c)
    assert m.tenant_names == ("code", "chat")
    assert m.arrival_s.tolist() == [0.0, 1.0, 2.0, 5.0, 5.0, 9.0]
    assert m.prompt_tokens.tolist() == [1, 10, 100, 2, 20, 3]  # tie at 5.0 keeps argument order
    assert [m.tenant_names[i] for i in m.tenant] == ["code", "chat", "code", "code", "chat", "code"]
    assert len(np.unique(m.request_id)) == 6
    assert [m.prefix_of(i).tolist() for i in range(6)] == [[1], [], [], [], [], [2, 2]]
    assert m.meta["merged_from"] == ["a", "b", "c"]
    with pytest.raises(WorkloadError):
        merge()

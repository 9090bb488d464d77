"""The host-to-device link: each stream copies in issue order, busy streams share the
link evenly, and a landing is projected until the link settles past it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shunter.engine.sim.transfers import KV_STREAM, WEIGHT_STREAM, HostToDeviceLink


def test_one_stream_copies_in_issue_order() -> None:
    link = HostToDeviceLink()
    first, second = link.issue(KV_STREAM, 0.0, 1.0), link.issue(KV_STREAM, 0.0, 2.0)
    late = link.issue(KV_STREAM, 5.0, 1.0)  # the link idles until it may start
    assert [link.landed(c) for c in (first, second, late)] == pytest.approx([1.0, 3.0, 6.0])


def test_busy_streams_share_the_link_evenly() -> None:
    link = HostToDeviceLink()
    kv, layer = link.issue(KV_STREAM, 0.0, 3.0), link.issue(WEIGHT_STREAM, 0.0, 1.0)
    # Both at half the link until the layer's 1 s is done at 2; then the swap-in alone.
    assert link.landed(layer) == pytest.approx(2.0)
    assert link.landed(kv) == pytest.approx(4.0)


def test_a_copy_takes_longer_on_the_link_while_it_shares_it() -> None:
    link = HostToDeviceLink()
    kv, layer = link.issue(KV_STREAM, 0.0, 3.0), link.issue(WEIGHT_STREAM, 0.0, 1.0)
    after = link.issue(WEIGHT_STREAM, 0.0, 1.0)  # starts once the layer before it landed
    assert link.took(layer) == pytest.approx(2.0)  # 1 s of copying at half the link
    assert link.took(after) == pytest.approx(2.0)  # 2 to 4, the swap-in still under way
    assert link.took(kv) == pytest.approx(5.0)  # 2 s of it shared, then 1 s alone
    link.settle(10.0)
    assert (after.started, after.landed) == pytest.approx((2.0, 4.0))
    alone = link.issue(WEIGHT_STREAM, 10.0, 1.0)
    assert link.took(alone) == pytest.approx(1.0)


def test_a_later_copy_on_another_stream_slows_one_not_yet_landed() -> None:
    link = HostToDeviceLink()
    kv = link.issue(KV_STREAM, 0.0, 2.0)
    assert link.landed(kv) == pytest.approx(2.0)  # projected: nothing else issued yet
    link.issue(WEIGHT_STREAM, 1.0, 1.0)
    assert link.landed(kv) == pytest.approx(3.0)
    link.settle(3.5)
    assert kv.landed == pytest.approx(3.0)  # final once settled
    # Settled time is past: a copy cannot start before it.
    assert link.landed(link.issue(WEIGHT_STREAM, 0.0, 1.0)) == pytest.approx(4.5)


def test_settling_in_steps_lands_copies_where_projected() -> None:
    link = HostToDeviceLink()
    copies = [link.issue(KV_STREAM, 0.0, 1.5), link.issue(WEIGHT_STREAM, 0.5, 1.0)]
    projected = [link.landed(c) for c in copies]
    for now in (0.2, 0.7, 1.9, 2.1, 9.0):
        link.settle(now)
    assert [c.landed for c in copies] == pytest.approx(projected)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([KV_STREAM, WEIGHT_STREAM]),
            st.floats(0.0, 10.0),
            st.floats(0.001, 5.0),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_the_link_never_moves_more_than_it_can(copies: list[tuple[str, float, float]]) -> None:
    link = HostToDeviceLink()
    issued = [link.issue(stream, t, d) for stream, t, d in copies]
    landed = [link.landed(c) for c in issued]
    for (_, t, d), end in zip(copies, landed, strict=True):
        assert end >= t + d - 1e-9  # never faster than alone
    # The link moves one second of copying per second at most, and never idles while a
    # copy may start: all of it lands between the first start plus all the work and the
    # last start plus all the work.
    work = sum(d for _, _, d in copies)
    assert min(t for _, t, _ in copies) + work - 1e-6 <= max(landed)
    assert max(landed) <= max(t for _, t, _ in copies) + work + 1e-6
    # Within a stream, copies land in issue order.
    for stream in (KV_STREAM, WEIGHT_STREAM):
        ends = [e for (s, _, _), e in zip(copies, landed, strict=True) if s == stream]
        assert ends == sorted(ends)

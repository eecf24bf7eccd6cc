"""First-fit decreasing: the quick packing gives exactly what the plain one does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sco.decide.binpack import Size, pack, pack_runs


def plain_first_fit(slices: list[Size], shape: Size, free: list[Size]) -> tuple[int, list[Size]]:
    """The textbook loop, written apart from `pack`: every slice scans every bin."""
    order = sorted(slices, key=lambda s: (s.cpus, s.memory_mb, sum(s.gres.values())), reverse=True)
    bins = list(free)
    for s in order:
        if not s.fits(shape):
            continue
        for k, room in enumerate(bins):
            if s.fits(room):
                bins[k] = room.less(s)
                break
        else:
            bins.append(shape.less(s))
    return len(bins) - len(free), bins[: len(free)]


sizes = st.builds(
    Size,
    st.sampled_from([0.5, 1.0, 2.0, 3.0, 8.0]),
    st.sampled_from([256.0, 1024.0, 4096.0, 30000.0]),
    st.sampled_from([{}, {"gpu": 1}, {"gpu": 2}]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(sizes, max_size=60), st.lists(sizes, max_size=8))
def test_quick_first_fit_is_first_fit(slices: list[Size], free: list[Size]) -> None:
    shape = Size(8.0, 32000.0, {"gpu": 4})
    got = pack(slices, shape, free)
    new, after = plain_first_fit(slices, shape, free)
    assert got.new_nodes == new
    assert list(got.free_after) == after
    assert len(got.unfit) == sum(1 for s in slices if not s.fits(shape))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(sizes, st.integers(0, 40)), max_size=12),
    st.lists(sizes, max_size=8),
    st.sampled_from([Size(8.0, 32000.0, {"gpu": 4}), Size(8.0, 32000.0)]),
)
def test_runs_pack_as_their_slices_do(
    runs: list[tuple[Size, int]], free: list[Size], shape: Size
) -> None:
    """A job's slices given as one run (size, count), whole new nodes worked out at
    once, pack exactly as the slices one by one in the plain loop."""
    slices = [s for s, m in runs for _ in range(m)]
    got = pack_runs(runs, shape, free)
    new, after = plain_first_fit(slices, shape, free)
    assert got.new_nodes == new
    assert list(got.free_after) == after
    assert len(got.unfit) == sum(1 for s in slices if not s.fits(shape))
    assert got == pack(slices, shape, free)


def test_equal_sizes_hash_alike_whatever_the_order_of_their_resources() -> None:
    a = Size(1, 2, {"gpu": 1, "fpga": 2})
    b = Size(1, 2, {"fpga": 2, "gpu": 1})
    assert a == b
    assert hash(a) == hash(b)
    assert a != Size(1, 2, {"gpu": 1})

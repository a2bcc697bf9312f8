"""Ring buffers and the request table: the order and back-pressure every block relies on."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from archsim.engine.queues import (make_queues, make_requests, q_peek, q_pop, q_push, q_remove, req_alloc,
                                   req_free)


@given(st.lists(st.tuples(st.sampled_from(["push", "pop", "remove"]), st.integers(0, 1000)), max_size=60),
       st.integers(1, 6))
def test_queue_behaves_like_a_bounded_list(ops, cap):
    Q = make_queues([cap, 3])
    model = []
    for op, v in ops:
        if op == "push":
            ok = q_push(Q, 0, v)
            assert ok == (len(model) < cap)
            if ok:
                model.append(v)
        elif op == "pop" and model:
            assert q_pop(Q, 0) == model.pop(0)
        elif op == "remove" and model:
            k = v % len(model)
            assert q_remove(Q, 0, k) == model.pop(k)
        assert Q.count[0] == len(model)
        assert [q_peek(Q, 0, k) for k in range(len(model))] == model
    assert Q.count[1] == 0  # the other queue is untouched


def test_request_table_allocates_until_full_and_recycles():
    R = make_requests(3)
    ids = [req_alloc(R, 0x1000 * i, 32, 0, i, 7, 5) for i in range(3)]
    assert sorted(ids) == [0, 1, 2]
    assert req_alloc(R, 0, 32, 0, 0, 0, 0) == -1
    req_free(R, ids[1])
    again = req_alloc(R, 0xabc, 64, 1, 9, 3, 11)
    assert again == ids[1] and R.addr[again] == 0xabc and R.nbytes[again] == 64 and R.t_created[again] == 11
    assert np.all(R.nfree == 0)

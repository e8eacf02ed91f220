"""Python threads sharing one context: assignments and host copies release the GIL and are
serialised per context, so concurrent use gives the same answers as sequential use."""
import threading

import numpy as np

import kiln


def test_threads_share_a_context():
    ctx = kiln.Context()
    rng = np.random.default_rng(7)
    host = rng.standard_normal((256, 64)).astype(np.float32)
    A = ctx.array(host)
    errors = []

    def work(k):
        try:
            out = ctx.empty((256, 1))
            for i in range(40):
                out[:] = ctx.mean(ctx.square(A * (k + 1) - ctx.mean(A * (k + 1), axis=1)), axis=1)
                got = out.get()[:, 0]
                want = ((host * (k + 1)).astype(np.float64)).var(axis=1)
                if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                    errors.append(f"thread {k} iteration {i}: max err {np.abs(got - want).max()}")
                    return
                back = ctx.array(host * k)  # uploads from several threads too
                if not np.array_equal(back.get(), host * k):
                    errors.append(f"thread {k} iteration {i}: upload round trip differs")
                    return
        except Exception as e:  # noqa: BLE001 - reported below with the thread's name
            errors.append(f"thread {k}: {e!r}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

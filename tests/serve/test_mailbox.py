"""``serve.runs._Mailbox``: results posted from another thread reach their queues in order,
one drain per wake; the loop is woken by the mailbox's waker thread, never by the thread
that calls ``wake`` (the scheduler: a self-pipe write there lets go of the GIL on the steps'
path); the waker ends once its loop has closed."""

from __future__ import annotations

import asyncio
import threading
import time

from glassgpt.serve.runs import _Mailbox


def test_items_arrive_in_order_and_the_waker_writes() -> None:
    loop = asyncio.new_event_loop()
    box = _Mailbox(loop)
    writers: list[str] = []
    real = loop.call_soon_threadsafe

    def recording(*args):  # which thread wakes the loop
        writers.append(threading.current_thread().name)
        return real(*args)

    loop.call_soon_threadsafe = recording  # type: ignore[method-assign]

    async def main() -> list[int]:
        q: asyncio.Queue[int] = asyncio.Queue()

        def scheduler() -> None:
            for step in range(5):
                for i in range(3):
                    box.post(q, 3 * step + i)
                box.wake()
                time.sleep(0.01)

        t = threading.Thread(target=scheduler, name="fake-scheduler")
        t.start()
        got = [await asyncio.wait_for(q.get(), 5) for _ in range(15)]
        t.join()
        return got

    got: list[list[int]] = []

    def in_a_thread() -> None:  # (a thread of its own: no other loop is running there)
        try:
            got.append(loop.run_until_complete(main()))
        finally:
            loop.close()

    runner = threading.Thread(target=in_a_thread)
    runner.start()
    runner.join(30)
    assert got == [list(range(15))]
    assert writers and set(writers) == {"glassgpt-waker"}
    box.waker.join(timeout=5)
    assert not box.waker.is_alive()

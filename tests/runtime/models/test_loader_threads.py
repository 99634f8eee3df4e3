"""Building models in several threads at once (tensor-parallel ranks as threads, two engines): the loader's
skip of torch's random init holds only in the building threads, and nothing of it outlives them."""
from __future__ import annotations

import threading

import torch
from torch import nn

from radixlang.runtime.models.loading.loader import _skip_init


def _initialised() -> bool:
    """Whether torch's init functions run here: a normal draw of 4,096 values has a standard deviation near 1."""
    return nn.init.normal_(torch.zeros(4096)).std().item() > 0.5


def test_two_threads_building_at_once_leave_torchs_init_working_for_everyone():
    torch_normal = nn.init.normal_
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def a() -> None:
        with _skip_init(torch.device("cpu")):
            seen["a skips"] = not _initialised()
            a_inside.set()
            b_inside.wait(30)
        a_done.set()

    def b() -> None:
        a_inside.wait(30)
        with _skip_init(torch.device("cpu")):  # opened after a's, closed after it: the order that broke init
            b_inside.set()
            a_done.wait(30)
            seen["b skips"] = not _initialised()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    a_inside.wait(30)
    seen["bystander initialises"] = _initialised()  # this thread builds nothing while a and b do
    for t in threads:
        t.join(30)
    assert seen == {"a skips": True, "b skips": True, "bystander initialises": True}
    assert nn.init.normal_ is torch_normal and _initialised()

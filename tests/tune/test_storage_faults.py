"""A checkpoint that cannot be written (a full disk, a storage folder removed or read-only) is a storage fault that
Tune retries, not an error of the trial's own code that fails its members for good."""
from __future__ import annotations

import pytest

from hydro.tune.search.session import TrialLost, repeats
from hydro.tune.search.trainable import _report_checkpoint


class FullDisk:
    def report(self, checkpoint=None):
        raise OSError(28, "No space left on device")


def test_a_checkpoint_that_cannot_be_written_is_retried_by_tune():
    with pytest.raises(TrialLost, match=r"writing the trial's checkpoint failed \(storage\): OSError: \[Errno 28\]") \
            as raised:
        _report_checkpoint(FullDisk(), {"epoch": 1})
    assert not repeats(raised.value)  # MemberSession.failing() lets it reach Tune, which retries the trial

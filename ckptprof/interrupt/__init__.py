"""Spot/preemption interruptions: notices (signals, opt-in metadata services) and the
record that lets a resumed process link back to the interrupted one."""

from ckptprof.interrupt.notice import Notice, NoticeWatcher
from ckptprof.interrupt.record import InterruptionRecord, read_record, write_record

__all__ = ["InterruptionRecord", "Notice", "NoticeWatcher", "read_record", "write_record"]

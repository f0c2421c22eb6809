"""Writes reference.tfevents with TensorBoard's own writer (RecordWriter and the protos of the
installed `tensorboard` package), the reference the C++ framing and event tests compare with.

Run from the repository root:  .venv/bin/python tests/unit/metrics/assets/make_reference_events.py
The output is deterministic (fixed wall times), so running it again gives the same bytes.
"""

import os

from google.protobuf import struct_pb2
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2 as hparams_data
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.record_writer import RecordWriter


def scalars_event():
    summary = summary_pb2.Summary()
    summary.value.add(tag="train/loss", simple_value=2.5)
    summary.value.add(tag="lr", simple_value=0.001)
    return event_pb2.Event(wall_time=1700000001.25, step=3, summary=summary)


def text_event():
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"model:\n  init: random"])
    summary = summary_pb2.Summary()
    summary.value.add(
        tag="config",
        metadata=text_metadata.create_summary_metadata(display_name="", description=""),
        tensor=tensor,
    )
    return event_pb2.Event(wall_time=1700000002.0, step=0, summary=summary)


def hparams_event(tag, data):
    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, metadata=hparams_metadata.create_summary_metadata(data))
    return event_pb2.Event(wall_time=1700000003.0, step=0, summary=summary)


def session_start():
    start = hparams_data.SessionStartInfo(start_time_secs=1700000000.0)
    start.hparams["training.lr"].CopyFrom(struct_pb2.Value(number_value=0.001))
    return hparams_data.HParamsPluginData(session_start_info=start)


def session_end():
    end = hparams_data.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=1700000009.0)
    return hparams_data.HParamsPluginData(session_end_info=end)


def main():
    events = [
        event_pb2.Event(wall_time=1700000000.5, file_version="brain.Event:2"),
        event_pb2.Event(
            wall_time=1700000000.75,
            step=4,
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START),
        ),
        scalars_event(),
        text_event(),
        hparams_event(hparams_metadata.SESSION_START_INFO_TAG, session_start()),
        hparams_event(hparams_metadata.SESSION_END_INFO_TAG, session_end()),
    ]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.tfevents")
    with open(path, "wb") as f:
        writer = RecordWriter(f)
        for e in events:
            writer.write(e.SerializeToString())


if __name__ == "__main__":
    main()

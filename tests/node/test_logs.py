import json
import logging

from node.logs import JsonFormatter


def test_log_lines_are_json_with_the_extra_fields():
    record = logging.makeLogRecord({"name": "node.validator", "levelno": logging.INFO, "levelname": "INFO",
                                    "msg": "verdict submitted %d", "args": (7,), "inference_id": 7, "valid": True})
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "verdict submitted 7" and line["inference_id"] == 7 and line["valid"] is True
    assert line["level"] == "info" and line["logger"] == "node.validator" and line["ts"].endswith("Z")

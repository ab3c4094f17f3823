"""Slack adapter. ``adapters.slack.testing`` holds a loopback fake Slack for tests."""

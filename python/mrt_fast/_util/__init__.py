"""Helpers every area shares: messages, files, memory, the device rule."""

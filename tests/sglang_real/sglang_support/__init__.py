"""Helpers for the real-SGLang suite: the torchvision stand-in, a rank process and a bootstrap
server process built from SGLang's own classes."""

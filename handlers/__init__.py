"""Tornado handlers: thin; they parse, call a domain function, and render."""

"""Renderers: terminal (rich), JSON, JUnit XML, Markdown/HTML with PNG plots."""

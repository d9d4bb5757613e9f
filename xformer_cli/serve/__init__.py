"""Serving: ``xf serve``'s directions, its HTTP server (LibreTranslate's API and the page), the
batch queue, request fields, one request's translation and the access log. Imports the wings
below it, never ``formats`` or ``train``."""

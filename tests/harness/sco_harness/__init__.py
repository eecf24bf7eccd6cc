"""Builders and fakes for tests of every layer. Real code, no mocks."""

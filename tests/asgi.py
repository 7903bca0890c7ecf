"""The test project as an ASGI application, served by uvicorn in tests/test_async_producers.py
(one async view producing through the async API) and tests/api/test_event_stream.py."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()

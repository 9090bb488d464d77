"""The gateway's routes, mounted at the root: ``/v1/...`` and ``/models/<name>/v1/...``."""

from django.urls import URLPattern, URLResolver, path, re_path

from shunter.gateway import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("v1/models", views.models, name="gateway-models"),
    path("v1/chat/completions", views.chat_completions, name="gateway-chat"),
    path("v1/completions", views.completions, name="gateway-completions"),
    path("models/<str:name>/v1/models", views.models, name="gateway-model-models"),
    path(
        "models/<str:name>/v1/chat/completions", views.chat_completions, name="gateway-model-chat"
    ),
    path("models/<str:name>/v1/completions", views.completions, name="gateway-model-completions"),
    # One model: GET /v1/models/{id} (an id may hold a "/").
    re_path(r"^v1/(?P<rest>models/.+)$", views.unknown, name="gateway-model"),
    re_path(
        r"^models/(?P<name>[^/]+)/v1/(?P<rest>models/.+)$",
        views.unknown,
        name="gateway-model-model",
    ),
    # The rest of the gateway's URL space (``/v1``, a name with an encoded ``/``): 404.
    re_path(r"^(?:v1|models)(?:/|$)", views.unknown, name="gateway-unknown"),
]

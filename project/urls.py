from django.contrib import admin
from django.urls import include, path

from shunter.platform import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/", include("shunter.project.api_urls")),
    path("console/", include("shunter.console.urls")),
    path("", include("shunter.gateway.urls")),
]

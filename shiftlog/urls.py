"""The project's root URLs: the admin, the API and the dashboard's pages side by side.

The dashboard's own urls (dashboard/urls.py) name no API view: the two apps meet only here.
"""

from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from api import connect_views
from api.main import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # Browsers ask for /favicon.ico where a page names no icon (the admin's, a raw file).
    path("favicon.ico", RedirectView.as_view(url=static("shiftlog/favicon.svg"))),
    # The run page's "Make a token for this run" (an API token, made by a person on the page).
    path("runs/<int:run_id>/token", connect_views.run_token, name="run-token"),
    path("", include("dashboard.urls")),
]

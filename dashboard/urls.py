from __future__ import annotations

from django.contrib import admin
from django.urls import path

from dashboard import views

urlpatterns = [
    path("", views.home, name="home"),
    path("login/<uidb64>/<token>/", views.login_link, name="login-link"),
    path("admin/", admin.site.urls),
]

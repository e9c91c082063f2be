"""The project's URLs: the orders app at the root."""

from django.urls import include, path

urlpatterns = [path("", include("orders.urls"))]

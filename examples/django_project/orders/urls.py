"""Start an order, read its status, approve it; the operators' dashboard at /ops/."""

from django.urls import path

from . import dashboard, views

urlpatterns = [
    path("orders", views.start_order, name="start-order"),
    path("orders/<str:order_id>", views.order_status, name="order-status"),
    path("orders/<str:order_id>/approve", views.approve_order, name="approve-order"),
    path("ops/", dashboard.dashboard, name="ops"),
    path("ops/<path:path>", dashboard.dashboard, name="ops-page"),
]

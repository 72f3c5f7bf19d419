"""SPEC part 4, channels: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["channels"])

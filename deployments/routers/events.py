"""SPEC part 4, events: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["events"])

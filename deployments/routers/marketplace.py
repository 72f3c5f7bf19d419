"""SPEC part 4, marketplace: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["marketplace"])

"""SPEC part 4, inference: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["inference"])

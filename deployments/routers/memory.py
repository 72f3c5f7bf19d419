"""SPEC part 4, memory: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["memory"])

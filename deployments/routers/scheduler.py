"""SPEC part 4, scheduler: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["scheduler"])

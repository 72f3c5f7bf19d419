"""SPEC part 4, workspace: the endpoints land with their own issue."""

from fastapi import APIRouter

router = APIRouter(tags=["workspace"])

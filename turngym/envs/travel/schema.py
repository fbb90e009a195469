"""Table and column names of TravelPlanner's sandbox database (kept verbatim).

The generated database and the loader for the published CSV files both produce exactly
these columns, so code written against TravelPlanner's ``pandas`` tables runs unchanged.
"""

from __future__ import annotations

FLIGHTS = "flights"
ACCOMMODATIONS = "accommodations"
RESTAURANTS = "restaurants"
ATTRACTIONS = "attractions"
DISTANCE = "distance"
CITIES = "cities"

COLUMNS: dict[str, list[str]] = {
    FLIGHTS: [
        "Flight Number",
        "Price",
        "DepTime",
        "ArrTime",
        "ActualElapsedTime",
        "FlightDate",
        "OriginCityName",
        "DestCityName",
        "Distance",
    ],
    ACCOMMODATIONS: [
        "NAME",
        "price",
        "room type",
        "house_rules",
        "minimum nights",
        "maximum occupancy",
        "review rate number",
        "city",
    ],
    RESTAURANTS: ["Name", "Average Cost", "Cuisines", "Aggregate Rating", "City"],
    ATTRACTIONS: ["Name", "Latitude", "Longitude", "Address", "Phone", "Website", "City"],
    DISTANCE: ["origin", "destination", "mode", "duration", "distance", "cost"],
    CITIES: ["City", "State"],
}
TABLES = tuple(COLUMNS)

ROOM_TYPES = ("Entire home/apt", "Private room", "Shared room")
HOUSE_RULES = ("No smoking", "No parties", "No children under 10", "No visitors", "No pets")
#: The cuisines TravelPlanner's queries constrain.
QUERY_CUISINES = ("Chinese", "American", "Italian", "Mexican", "Indian", "Mediterranean", "French")
ROAD_MODES = ("self-driving", "taxi")

#: query ``local_constraint`` values
HOUSE_RULE_VALUES = ("smoking", "parties", "children under 10", "visitors", "pets")
ROOM_TYPE_VALUES = ("not shared room", "shared room", "private room", "entire room")
TRANSPORT_VALUES = ("no flight", "no self-driving")


def road_cost(distance_km: float, mode: str) -> int:
    """TravelPlanner's cost of a road leg: self-driving 0.05 $/km, taxi 1 $/km (truncated)."""
    return int(distance_km * 0.05) if "driving" in mode else int(distance_km)

"""The geography of the generated world: real US states and cities (TravelPlanner uses US cities).

Each state carries an approximate centroid (latitude, longitude) and a spread in degrees;
city coordinates are drawn around it from the database seed, which keeps distances, flight
times and driving costs realistic without shipping a gazetteer. City names are unique across
states (the TravelPlanner evaluator maps a city to exactly one state).
"""

from __future__ import annotations

#: state -> (latitude, longitude, spread in degrees, cities)
STATES: dict[str, tuple[float, float, float, tuple[str, ...]]] = {
    "Alabama": (32.8, -86.8, 1.6, ("Birmingham", "Montgomery", "Mobile", "Huntsville", "Dothan")),
    "Alaska": (61.2, -149.9, 4.0, ("Anchorage", "Fairbanks", "Juneau", "Ketchikan", "Kodiak", "Nome")),
    "Arizona": (34.2, -111.6, 1.8, ("Phoenix", "Tucson", "Flagstaff", "Yuma", "Prescott", "Page")),
    "Arkansas": (34.9, -92.4, 1.4, ("Little Rock", "Fayetteville", "Fort Smith", "Texarkana", "Jonesboro")),
    "California": (36.8, -119.4, 3.0, (
        "Los Angeles", "San Francisco", "San Diego", "Sacramento", "San Jose", "Fresno", "Oakland",
        "Santa Barbara", "Bakersfield", "Palm Springs", "Monterey", "Santa Rosa", "Long Beach",
    )),
    "Colorado": (39.0, -105.5, 1.6, ("Denver", "Colorado Springs", "Aspen", "Durango", "Grand Junction", "Pueblo")),
    "Connecticut": (41.6, -72.7, 0.4, ("Hartford", "New Haven", "Bridgeport", "Stamford")),
    "Delaware": (39.0, -75.5, 0.3, ("Wilmington", "Dover", "Lewes")),
    "Florida": (28.1, -81.6, 2.0, (
        "Miami", "Orlando", "Tampa", "Jacksonville", "Tallahassee", "Fort Lauderdale", "Key West",
        "Sarasota", "Pensacola", "Fort Myers", "West Palm Beach", "Gainesville", "Punta Gorda",
    )),
    "Georgia": (32.7, -83.4, 1.4, ("Atlanta", "Savannah", "Augusta", "Macon", "Valdosta", "Brunswick")),
    "Hawaii": (20.8, -156.3, 1.2, ("Honolulu", "Kahului", "Kona", "Hilo", "Lihue")),
    "Idaho": (44.1, -114.7, 1.8, ("Boise", "Idaho Falls", "Pocatello", "Lewiston", "Twin Falls")),
    "Illinois": (40.0, -89.2, 1.6, ("Chicago", "Springfield", "Peoria", "Rockford", "Champaign", "Moline")),
    "Indiana": (39.9, -86.3, 1.2, ("Indianapolis", "Fort Wayne", "Gary", "Evansville", "Bloomington")),
    "Iowa": (42.0, -93.5, 1.4, ("Des Moines", "Cedar Rapids", "Dubuque", "Sioux City", "Waterloo")),
    "Kansas": (38.5, -98.4, 1.8, ("Wichita", "Topeka", "Manhattan", "Dodge City", "Salina")),
    "Kentucky": (37.5, -85.3, 1.4, ("Louisville", "Lexington", "Paducah", "Bowling Green", "Owensboro")),
    "Louisiana": (31.0, -92.0, 1.4, ("New Orleans", "Baton Rouge", "Shreveport", "Lafayette", "Lake Charles", "Monroe")),
    "Maine": (45.3, -69.2, 1.2, ("Bangor", "Sanford", "Bar Harbor", "Presque Isle", "Rockland")),
    "Maryland": (39.0, -76.8, 0.6, ("Baltimore", "Annapolis", "Hagerstown", "Salisbury")),
    "Massachusetts": (42.3, -71.8, 0.6, ("Boston", "Worcester", "Nantucket", "Hyannis", "Pittsfield")),
    "Michigan": (43.8, -84.7, 1.8, (
        "Detroit", "Grand Rapids", "Lansing", "Traverse City", "Kalamazoo", "Marquette", "Flint", "Saginaw",
    )),
    "Minnesota": (46.3, -94.3, 1.8, ("Minneapolis", "Duluth", "Rochester", "Bemidji", "Brainerd", "International Falls")),
    "Mississippi": (32.7, -89.7, 1.4, ("Meridian", "Gulfport", "Hattiesburg", "Tupelo", "Biloxi")),
    "Missouri": (38.4, -92.5, 1.6, ("St. Louis", "Kansas City", "Cape Girardeau", "Jefferson City", "Joplin", "Branson")),
    "Montana": (47.0, -109.6, 2.4, ("Billings", "Missoula", "Bozeman", "Great Falls", "Helena", "Kalispell")),
    "Nebraska": (41.5, -99.8, 1.8, ("Omaha", "Lincoln", "North Platte", "Grand Island", "Scottsbluff")),
    "Nevada": (39.3, -116.6, 2.0, ("Las Vegas", "Reno", "Elko", "Carson City")),
    "New Hampshire": (43.7, -71.6, 0.6, ("Manchester", "Concord", "Portsmouth", "Lebanon")),
    "New Jersey": (40.2, -74.7, 0.5, ("Newark", "Atlantic City", "Trenton", "Princeton")),
    "New Mexico": (34.4, -106.1, 1.8, ("Albuquerque", "Santa Fe", "Roswell", "Las Cruces", "Hobbs", "Farmington")),
    "New York": (42.9, -75.5, 1.6, (
        "New York", "Buffalo", "Saratoga Springs", "Syracuse", "Albany", "Ithaca", "Plattsburgh",
        "White Plains", "Elmira", "Binghamton", "Watertown", "Niagara Falls",
    )),
    "North Carolina": (35.6, -79.4, 1.6, (
        "Charlotte", "Raleigh", "Asheville", "Winston-Salem", "Greensboro", "New Bern",
        "Durham", "Hickory",
    )),
    "North Dakota": (47.5, -100.5, 1.6, ("Fargo", "Bismarck", "Minot", "Grand Forks", "Williston")),
    "Ohio": (40.3, -82.8, 1.2, ("Columbus", "Cleveland", "Cincinnati", "Toledo", "Dayton", "Akron")),
    "Oklahoma": (35.6, -97.5, 1.6, ("Oklahoma City", "Tulsa", "Lawton", "Stillwater", "Norman")),
    "Oregon": (44.0, -120.6, 1.8, ("Portland", "Eugene", "Medford", "Bend", "Klamath Falls", "Redmond")),
    "Pennsylvania": (40.9, -77.8, 1.4, (
        "Philadelphia", "Pittsburgh", "Harrisburg", "Allentown", "Erie", "Scranton", "State College", "Latrobe",
    )),
    "Rhode Island": (41.7, -71.5, 0.2, ("Providence", "Newport", "Warwick")),
    "South Carolina": (33.9, -80.9, 1.2, ("Charleston", "Columbia", "Greenville", "Myrtle Beach", "Hilton Head")),
    "South Dakota": (44.4, -100.2, 1.8, ("Sioux Falls", "Rapid City", "Pierre", "Aberdeen", "Brookings")),
    "Tennessee": (35.9, -86.4, 1.6, ("Nashville", "Memphis", "Knoxville", "Chattanooga", "Bristol", "Clarksville")),
    "Texas": (31.5, -99.3, 3.0, (
        "Houston", "Dallas", "Austin", "San Antonio", "El Paso", "Lubbock", "Amarillo", "Corpus Christi",
        "Midland", "Laredo", "Abilene", "Beaumont", "Killeen", "Brownsville", "Waco", "San Angelo", "Harlingen",
    )),
    "Utah": (39.3, -111.7, 1.6, ("Salt Lake City", "Provo", "St. George", "Ogden", "Moab", "Cedar City")),
    "Vermont": (44.0, -72.7, 0.5, ("Burlington", "Montpelier", "Rutland", "Stowe")),
    "Virginia": (37.5, -78.9, 1.4, (
        "Richmond", "Norfolk", "Roanoke", "Staunton", "Hampton", "Lynchburg", "Arlington",
    )),
    "Washington": (47.4, -120.5, 1.8, ("Seattle", "Spokane", "Bellingham", "Walla Walla", "Yakima", "Pasco", "Wenatchee")),
    "West Virginia": (38.6, -80.6, 1.0, ("Beckley", "Morgantown", "Huntington", "Clarksburg")),
    "Wisconsin": (44.6, -89.9, 1.4, ("Milwaukee", "Madison", "Green Bay", "Appleton", "La Crosse", "Eau Claire", "Rhinelander")),
    "Wyoming": (43.0, -107.5, 1.8, ("Cheyenne", "Casper", "Sheridan", "Laramie", "Cody", "Gillette")),
}


def all_cities() -> list[tuple[str, str]]:
    """Every ``(city, state)`` pair, in a fixed order."""
    return [(city, state) for state, (*_, cities) in STATES.items() for city in cities]

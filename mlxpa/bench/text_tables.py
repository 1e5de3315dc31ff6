"""The material the text workloads (:mod:`mlxpa.bench.text_workloads`) are made of, written
for them: people, companies, products, towns and the facts a passage tells about one, order
e-mails, reviews, headlines, story openings, and the worked examples of ``summarise`` and
``code-edit``. Every name is fictional; the e-mail domains are under ``.example``.
"""

from __future__ import annotations

FIRST_NAMES = ("Amira", "Ben", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hugo", "Ines",
               "Jonas", "Keiko", "Liam", "Maya", "Nikolai", "Olivia", "Pedro", "Quinn", "Rosa",
               "Samuel", "Tara", "Umar", "Vera", "William", "Yara", "Zoe")
LAST_NAMES = ("Abbott", "Brennan", "Castillo", "Dubois", "Eriksen", "Fischer", "Gallagher",
              "Haddad", "Ivanova", "Jansen", "Kowalski", "Lindqvist", "Moreau", "Novak",
              "Okafor", "Petrov", "Quintero", "Rossi", "Sato", "Thornton", "Underwood", "Varga",
              "Whitfield", "Yilmaz", "Zimmer")
# (company, e-mail domain)
COMPANIES = (("Alder & Finch", "alderfinch.example"),
             ("Brightwater Labs", "bright.example"),
             ("Copperfield Foods", "copper.example"),
             ("Dunmore Engineering", "dunmore.example"),
             ("Eastgate Clinic", "eastgate.example"),
             ("Fernhill Studio", "fernhill.example"),
             ("Greystone Logistics", "grey.example"),
             ("Harbourview Hotel", "harbour.example"),
             ("Ironbridge Cycles", "iron.example"),
             ("Juniper Architects", "juniper.example"),
             ("Kestrel Print Works", "kestrel.example"),
             ("Lowfield Farm Shop", "lowfield.example"),
             ("Marlow Dental", "marlow.example"),
             ("Northwind Books", "north.example"),
             ("Oakridge School", "oakridge.example"),
             ("Pinecrest Gardens", "pine.example"))
# Products, singular (the plural adds an "s").
PRODUCTS = ("desk lamp", "office chair", "laptop stand", "storage crate", "whiteboard",
            "coffee grinder", "wall clock", "filing cabinet", "monitor arm", "book stand",
            "kettle", "printer cartridge", "safety helmet", "umbrella", "water bottle",
            "notebook", "extension cable", "floor mat", "reading lamp", "tool kit")
COLOURS = ("black", "white", "grey", "navy blue", "forest green", "red", "oak brown", "silver")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")

# The three phrasings of an order e-mail (the fields of ``extraction``'s JSON, and {first}: the
# first name, {products}: the plural, {ref}: a quote number).
ORDER_MAILS = (
    "From: {name} <{email}>\nSubject: Order\n\nHello, please send {quantity} {colour} "
    "{products} to our office in {town} by {deliver_by}. Tel: {phone}.\n\n"
    "{first}, {company}",
    "From: {email}\n\nHi, {name} from {company} here. Could we order {quantity} of your "
    "{products} in {colour}, delivered to {town} before {deliver_by}? Phone: {phone}.",
    "From: {name} <{email}>\nSubject: Re: quote {ref}\n\n{company} confirms {quantity} x "
    "{product} ({colour}).\nShip to: {town}\nBy: {deliver_by}\nTel: {phone}",
)

# Fictional towns and the facts a passage about one tells.
TOWNS = ("Ashcombe", "Bramwick", "Calder Bridge", "Dunhollow", "Elmsworth", "Farrowby",
         "Glenmere", "Hollinsford", "Ivybury", "Kelthorpe", "Larkmoor", "Millbeck", "Nettleford",
         "Orrington", "Pendlecross", "Redhaven", "Saltmarsh", "Thornbury Vale", "Wetherden",
         "Yarrowfield")
REGIONS = ("northern hills", "eastern lowlands", "western valleys", "southern downs",
           "lake country")
RIVERS = ("Avelin", "Brent", "Corran", "Dove", "Esk", "Frome", "Lune", "Ouse", "Tamar", "Wye")
FOUNDERS = ("wool merchants", "monks from a nearby abbey", "salt traders", "a family of millers",
            "fishermen", "railway engineers")
INDUSTRIES = ("furniture making", "tourism", "dairy farming", "paper milling", "boat building",
              "software", "glassmaking", "brewing")
FESTIVALS = ("Lantern Festival", "Cheese Fair", "Kite Weekend", "Harvest Parade", "Boat Race",
             "Folk Music Week")
LANDMARKS = ("clock tower", "stone bridge", "town hall", "old lighthouse", "covered market",
             "windmill")
STREETS = ("Mill Lane", "Station Road", "Church Street", "Quay Street", "High Street")
CITIES = ("the capital", "the county town", "the coast", "the airport")
# A town passage: its first sentence, then facts as (sentence, question, answer); {t} is the
# town, the other fields are drawn from the tables above.
TOWN_INTRO = "{t} is a small town in the {region}."
TOWN_FACTS = (
    ("{t} was founded in {founded} by {founders}.", "When was {t} founded?", "In {founded}"),
    ("The town lies on the River {river}, {km} kilometres from the sea.",
     "Which river does {t} lie on?", "The River {river}"),
    ("About {population} people live in {t} today.", "How many people live in {t}?",
     "About {population}"),
    ("Most jobs in {t} are in {industry}.", "Which industry gives most jobs in {t}?",
     "In {industry}"),
    ("Every {month} the town holds its {festival}, which draws visitors from across the "
     "region.", "When does {t} hold its {festival}?", "Every {month}"),
    ("Its best-known building is the {landmark}, finished in {built}.",
     "What is the best-known building in {t}?", "The {landmark}"),
    ("The current mayor, {mayor}, was elected in {elected}.", "Who is the mayor of {t}?",
     "{mayor}"),
    ("A market is held on {street} every {weekday}.", "On which day is the market held in {t}?",
     "Every {weekday}"),
    ("Trains to {city} leave from the station every {minutes} minutes.",
     "How often do trains to {city} leave {t}?", "Every {minutes} minutes"),
    ("{t} has been twinned with {twin} since {twinned}.", "Which town is {t} twinned with?",
     "{twin}"),
)

# Review templates by sentiment ({p}: a product, singular).
REVIEWS = {
    "positive": ("The {p} works perfectly and arrived a day early.",
                 "Really happy with this {p}, it feels solid and looks great.",
                 "Best {p} I have owned, my whole family uses it every day.",
                 "Easy to set up and the {p} does exactly what it promises.",
                 "Great value for money, I would buy this {p} again."),
    "negative": ("The {p} broke after two weeks and support never replied.",
                 "Cheap materials, the {p} wobbles and the paint is already peeling.",
                 "Arrived damaged and the replacement {p} had the same fault.",
                 "Far too loud, I returned the {p} after one day.",
                 "The instructions were useless and the {p} never worked properly."),
    "neutral": ("The {p} came in a cardboard box with a manual.",
                "It is a {p} in the colour shown in the pictures.",
                "The {p} is about the size I expected.",
                "Delivered on Tuesday, the {p} is in the spare room for now.",
                "I bought the {p} for my brother, he has not tried it yet."),
}
SENTIMENTS = ("positive", "negative", "neutral")
# Headline templates by topic ({t}: a town, {c}: a company).
HEADLINES = {
    "sport": ("{t} United win the regional cup after a late penalty",
              "Local runner from {t} breaks the half-marathon record",
              "{t} cricket club signs a new captain for the summer season",
              "Cyclists race through {t} as the national tour comes to town"),
    "business": ("{c} opens a second branch in {t}",
                 "{c} reports record profits and hires forty staff",
                 "Shop owners in {t} say rents have doubled in five years",
                 "{c} agrees a takeover by a larger rival"),
    "science": ("Researchers find a rare orchid in woods near {t}",
                "New telescope lets {t} students photograph distant galaxies",
                "Study of the river near {t} finds cleaner water than a decade ago",
                "Engineers at {c} test a battery that charges in minutes"),
    "politics": ("{t} council votes to close the old library",
                 "Voters in {t} choose a new mayor after a close race",
                 "Minister visits {t} to promise funds for the bypass",
                 "Residents of {t} sign a petition against the new car park"),
}
TOPICS = ("sport", "business", "science", "politics")

# The opening sentences of the ``continue`` workload ({n}: a person, {t}: a town, {m}: a month,
# {c}: a company, {p}: a product).
OPENINGS = ("When {n} came back to {t} after twenty years, the bakery on the corner was gone.",
            "The letter arrived on a wet morning in {m}, addressed to someone who had never lived "
            "in {t}.",
            "Nobody in {t} could remember who had planted the oak tree in the middle of the "
            "square.",
            "{c} announced on Monday that it would stop making {p} by the end of the year.",
            "It was the third time that week that {n} had missed the last train home.",
            "The storm reached {t} just after midnight, and by dawn the river had burst its "
            "banks.",
            "For most of its history, {t} was known for one thing only: its market.",
            "{n} had always wanted to open a small shop, and in {m} she finally did.",
            "The first thing you notice about {t} is how quiet it is on a Sunday.",
            "On the last day of {m}, the old lighthouse keeper of {t} switched off the lamp for "
            "good.")

# The worked examples of ``summarise``: (paragraph, one-sentence summary).
SUMMARY_SHOTS = (
    ("Return a new list containing all items from the iterable in ascending order. A custom "
     "key function can be supplied to customize the sort order, and the reverse flag can be "
     "set to request the result in descending order. The sort is stable: when multiple "
     "records have the same key, their original order is preserved.",
     "It returns the items of an iterable as a new sorted list, optionally by a key or in "
     "reverse, keeping the original order of equal items."),
    ("Open the file and return a corresponding file object. If the file cannot be opened, an "
     "OSError is raised. The mode argument is an optional string that specifies the mode in "
     "which the file is opened; it defaults to reading in text mode, where the file contents "
     "are decoded to strings using the given or the platform's default encoding.",
     "It opens a file in the given mode (text reading by default) and returns a file object, "
     "raising OSError on failure."),
)

# The worked examples of ``code-edit``: (function, the parameter renamed).
CODE_SHOTS = (
    ('def clamp(value, low, high):\n'
     '    if value < low:\n'
     '        return low\n'
     '    if value > high:\n'
     '        return high\n'
     '    return value\n', "value"),
    ('def count_words(text, min_length=1):\n'
     '    counts = {}\n'
     '    for word in text.split():\n'
     '        if len(word) >= min_length:\n'
     '            counts[word] = counts.get(word, 0) + 1\n'
     '    return counts\n', "min_length"),
)
